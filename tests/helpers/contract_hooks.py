"""Schemathesis hooks for tests/test_contract_fuzz.py (loaded by SCHEMATHESIS_HOOKS).

Two rules of the API cannot be written in JSON Schema, so the fuzzer makes requests the
document admits and the broker refuses with 400, which it reports as valid data refused
(``positive_data_acceptance``). Those refusals, and only they, are dropped here; every
other failure of every check stands.

- An entry of a produce without a ``partition`` is placed by its records' key, so every
  record of it carries the same key (docs/http-api.md, Partitions by key). The
  document says each record then has a key (``ProduceTopicPartition``); that the keys
  are *equal*, no keyword can say (``const`` needs the value in advance).
- A list of partitions names each partition once (a commit's ``offsets``, a reset's
  and a consume's ``topic_partitions``). The document says ``uniqueItems``, which
  compares whole items: the same partition with two different offsets passes it.
"""

from __future__ import annotations

from typing import Any

import schemathesis

# The broker's words for the two refusals (app/broker/topics.py, app/groups/offsets.py,
# app/routes/consume.py).
INEXPRESSIBLE = ("without a partition needs one key on every record",
                 "a partition appears more than once")


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """False (drop it) for a refusal of schema-valid data by one of the rules above."""
    inexpressible = (type(failure).__name__ == "RejectedPositiveData"
                     and response.status_code == 400
                     and any(words in response.text for words in INEXPRESSIBLE))
    return not inexpressible
