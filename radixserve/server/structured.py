"""The request fields that ask for structured output, in the three dialects clients speak:
OpenAI's ``response_format``, vLLM's ``structured_outputs`` and SGLang's top-level
``regex`` / ``json_schema`` / ``ebnf``. Each becomes one grammar field of ``SamplingParams``;
asking for two at once, or for a kind this server does not build, is a 400 naming it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# vLLM's guided_* fields, before structured_outputs replaced them: named in a 400, never
# silently ignored
LEGACY_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = Field(default=None, description="the schema is always enforced")


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("response_format.json_schema goes with type json_schema, only")
        return self


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs``: exactly one of these."""

    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = Field(default=None, description="EBNF, root rule `root`")
    json_object: bool | None = None


class StructuredFields(BaseModel):
    """Mixed into the OpenAI request bodies."""

    model_config = ConfigDict(extra="ignore")

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    regex: str | None = Field(default=None, description="SGLang's: the output matches it")
    json_schema: str | None = Field(default=None, description="SGLang's: a JSON schema's text")
    ebnf: str | None = Field(default=None, description="SGLang's: an EBNF grammar")

    @model_validator(mode="before")
    @classmethod
    def _reject_legacy(cls, data: Any) -> Any:
        if isinstance(data, dict) and (legacy := [k for k in LEGACY_FIELDS if k in data]):
            raise ValueError(
                f"not supported by this server: {', '.join(legacy)} (use structured_outputs)"
            )
        return data

    def grammar_fields(self) -> dict[str, Any]:
        """The grammar field of ``SamplingParams`` these fields ask for (none: ``{}``)."""
        asked: dict[str, tuple[str, Any]] = {}
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            asked["response_format"] = ("json_object", True)
        elif rf is not None and rf.type == "json_schema":
            asked["response_format"] = ("json_schema", rf.json_schema.schema_)
        so = self.structured_outputs
        if so is not None:
            given = {
                "json_schema": so.json_,
                "regex": so.regex,
                "choice": so.choice,
                "ebnf": so.grammar,
                "json_object": so.json_object or None,
            }
            given = {k: v for k, v in given.items() if v is not None}
            if len(given) != 1:
                raise ValueError("structured_outputs takes exactly one of its fields")
            asked["structured_outputs"] = next(iter(given.items()))
        for name in ("regex", "json_schema", "ebnf"):
            if getattr(self, name) is not None:
                asked[name] = (name, getattr(self, name))
        if len(asked) > 1:
            raise ValueError(f"give one structured output, not {', '.join(asked)}")
        return dict(asked.values())
