"""Request bodies that refuse keys they do not read.

Pydantic drops a key a model has no field for, so ``{"block_hash": [...]}``
(a typo for ``block_hashes``) was answered as if the field were missing, and
``{"block_hashes": [...], "since": 5}`` as if ``since`` were a filter the
route applied. Each unknown key is now a 422 in the API's validation shape
(app/api/validation_errors.py), one error naming the keys, escaped and cut as
every message is (offload/unknown_keys.py), with the field each is closest to:
pydantic's own ``extra="forbid"`` answers one error per key, so a body of
100,000 keys made a 422 of megabytes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from offload.unknown_keys import unknown_keys


class StrictBody(BaseModel):
    """A JSON body whose every key must be one of its fields."""

    model_config = ConfigDict(extra="forbid")
    """Declares ``additionalProperties: false`` in the schema, which clients and
    schemathesis read; ``refuse_unknown_keys`` refuses them first, in one error."""

    @model_validator(mode="before")
    @classmethod
    def refuse_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            fields = list(cls.model_fields)
            unknown = unknown_keys(data, fields)
            if unknown is not None:
                raise PydanticCustomError(
                    "extra_forbidden",
                    f"the body has key(s) it does not take: {unknown}; it takes: "
                    + ", ".join(fields),
                )
        return data
