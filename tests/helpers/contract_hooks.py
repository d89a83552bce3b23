"""Schemathesis hooks for tests/test_contract_fuzz.py (loaded by SCHEMATHESIS_HOOKS).

Two rules of the API cannot be written in JSON Schema, so the fuzzer makes requests the
document admits and the broker refuses with 400, which it reports as valid data refused
(``positive_data_acceptance``). Those refusals, and only they, are dropped here; every
other failure of every check stands.

- An entry of a produce without a ``partition`` is placed by its records' key, so every
  record of it carries the same key (docs/http-api.md, Partitions by key). The
  document says each record then has a key (``ProduceTopicPartition``); that the keys
  are *equal*, no keyword can say (``const`` needs the value in advance).
- A body's ``Content-Encoding`` says how its bytes are coded; the document declares the
  header (identity, gzip, zstd) beside a schema of the *decoded* body, and the fuzzer
  sends the schema's JSON uncoded whatever coding it names, which the broker refuses as
  a body that does not decode. Likewise it may ask for zstd answers that its HTTP stack
  cannot decode. Those two, and only they, are dropped too;
  tests/test_wire_compression.py covers the codings.
- A list of partitions names each partition once (a commit's ``offsets``, a reset's
  and a consume's ``topic_partitions``). The document says so in the list's
  description only: ``uniqueItems`` compares whole items (the same partition with two
  different offsets passes it), and no keyword compares a part of each item.
"""

from __future__ import annotations

from typing import Any

import schemathesis

# The broker's words for the two refusals (app/broker/topic_view.py,
# app/groups/committed_offsets.py, app/broker/consume_call.py).
CODINGS = ("zstd", "gzip", "x-gzip")
INEXPRESSIBLE = ("without a partition needs one key on every record",
                 "a partition appears more than once")


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """False (drop it) for a refusal of schema-valid data by one of the rules above."""
    inexpressible = (type(failure).__name__ == "RejectedPositiveData"
                     and response.status_code == 400
                     and any(words in response.text for words in INEXPRESSIBLE))
    return not (inexpressible or _uncoded_body(failure, case, response)
                or _undecodable_answer(failure, response))


def _header(headers: Any, name: str) -> str:
    for key, value in dict(headers or {}).items():
        if key.lower() == name:
            return str(value[0] if isinstance(value, list) and value else value).lower()
    return ""


def _uncoded_body(failure: Any, case: Any, response: Any) -> bool:
    return (type(failure).__name__ == "RejectedPositiveData"
            and response.status_code == 400 and "does not decode" in response.text
            and _header(case.headers, "content-encoding") in CODINGS)


def _undecodable_answer(failure: Any, response: Any) -> bool:
    return ("deserializ" in type(failure).__name__.lower()
            and _header(response.headers, "content-encoding") == "zstd")
