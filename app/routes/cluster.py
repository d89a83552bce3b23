"""``GET /cluster``: the broker members as this broker sees them.

With ``LLOG_AFFINITY`` on, every broker worker is a member (docs/protocol.md, MEMBER) and
each partition has a preferred appender, the first member of its rendezvous ranking
(``algorithm``). A client may rank the members itself to send each partition's records
where they are appended; ``digest`` changes whenever the set of members does, so the
client knows when to fetch the list again. With affinity off the list is empty.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict

from app.broker.assembly import Broker
from app.cluster.rendezvous import ALGORITHM
from app.routes.deps import running_broker

router = APIRouter(tags=["cluster"])


class ClusterMember(BaseModel):
    member_id: str
    broker_id: str
    url: str
    roles: list[str]


class ClusterResponse(BaseModel):
    """The members by id; ``digest``: the first 12 hex digits of the sha256 of their ids
    (one per line, sorted)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "digest": "a776846b461c", "algorithm": ALGORITHM, "members": [
            {"member_id": "broker-1.w0", "broker_id": "broker-1",
             "url": "http://10.0.0.5:8080", "roles": ["write", "read", "compact"]},
            {"member_id": "broker-2.w0", "broker_id": "broker-2",
             "url": "http://10.0.0.6:8080", "roles": ["write", "read", "compact"]}]}]})

    digest: str
    algorithm: str
    members: list[ClusterMember]


@router.get("/cluster", response_model=ClusterResponse,
            summary="The broker members and how partitions are ranked among them",
            responses={200: {"description": "the members this broker sees (none with "
                                            "LLOG_AFFINITY off)"}})
async def get_cluster(broker: Annotated[Broker, Depends(running_broker)]
                      ) -> ClusterResponse:
    view = broker.members.view()
    return ClusterResponse(digest=view.digest, algorithm=ALGORITHM, members=[
        ClusterMember(member_id=m.member_id, broker_id=m.broker_id, url=m.url,
                      roles=list(m.roles)) for m in view.members])
