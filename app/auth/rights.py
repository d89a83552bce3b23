"""Rights and the names they apply to: the ACL of one principal.

A grant names topics (or consumer groups) exactly, or by prefix with a trailing ``*``
(``logs.*``; ``*`` alone is every name). Topic names cannot contain ``*``, so a pattern
is never mistaken for a name.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


class Right(enum.StrEnum):
    """What a principal may do. Describing or listing a topic needs any topic right."""

    PRODUCE = "produce"  # append to the topic (and create it on use when auto-create is on)
    CONSUME = "consume"  # read it, and its offsets
    GROUP = "group"      # act as, or manage, a consumer group (named by group, not topic)
    ADMIN = "admin"      # create, change and delete the topic


TOPIC_RIGHTS = (Right.PRODUCE, Right.CONSUME, Right.ADMIN)


@dataclass(frozen=True)
class Names:
    """A set of names: exact ones and prefixes."""

    exact: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()

    @classmethod
    def of(cls, patterns: Iterable[str]) -> Names:
        exact: set[str] = set()
        prefixes: list[str] = []
        for pattern in patterns:
            if pattern.endswith("*"):
                prefixes.append(pattern[:-1])
            else:
                exact.add(pattern)
        return cls(frozenset(exact), tuple(sorted(set(prefixes))))

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        return name in self.exact or any(name.startswith(p) for p in self.prefixes)

    def __bool__(self) -> bool:
        return bool(self.exact or self.prefixes)


@dataclass(frozen=True)
class Acl:
    """For each right, the names it applies to (topics; consumer groups for GROUP)."""

    grants: Mapping[Right, Names] = field(default_factory=dict)

    @classmethod
    def of(cls, patterns: Mapping[Right, Iterable[str]]) -> Acl:
        return cls({right: Names.of(names) for right, names in patterns.items()})

    def allows(self, right: Right, name: str) -> bool:
        names = self.grants.get(right)
        return names is not None and name in names

    def denied(self, right: Right, names: Iterable[str]) -> list[str]:
        """The names among ``names`` this ACL does not grant ``right`` on, sorted."""
        return sorted({n for n in names if not self.allows(right, n)})

    def sees_topic(self, topic: str) -> bool:
        """Whether the principal may know the topic (describe, list): any topic right."""
        return any(self.allows(right, topic) for right in TOPIC_RIGHTS)


NO_RIGHTS = Acl()
