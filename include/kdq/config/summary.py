"""One streaming summary of kdq.toml (``[[summaries]]``): which topic, which numeric field, grouped how."""

from __future__ import annotations

import re
from decimal import Decimal

from pydantic import Field, field_validator, model_validator

from kdq.config.sections import Section, check_regex

SUMMARY_PATTERN_PREFIX = "re:"
_PATH_SEGMENT = re.compile(r"[^.\s'\"]+")


def _check_json_path(value: str) -> str:
    """A dotted field path (``value``, ``labels.env``): the same syntax as a rule's event_time_field."""
    if not value or not all(_PATH_SEGMENT.fullmatch(part) for part in value.split(".")):
        raise ValueError(f"expected a dotted JSON field path such as 'value' or 'labels.env', got {value!r}")
    return value


class SummaryConfig(Section):
    """One streaming summary (``[[summaries]]`` in kdq.toml): statistics of a numeric field per window and group.

    ``topic`` is an exact topic name or ``re:<regex>`` (whole-name match, like
    the rules). The topic is always part of a summary's key: lateness is
    judged per topic, so a window is closed topic by topic.
    """

    name: str = Field(description="identifier; InfluxDB measurement and metrics-topic key")
    topic: str = Field(description="exact topic name, or re:<regex> (full match)")
    value: str = Field(description="dotted JSON path of the numeric field")
    group_by: tuple[str, ...] = Field(default=(), description="dotted JSON paths of the group fields")
    window_seconds: int = Field(default=600, gt=0)
    allowed_lateness_seconds: int = Field(default=3600, ge=0)
    significant_digits: int | None = Field(default=None, ge=1, le=15)
    step: float | None = Field(default=None, gt=0)
    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)
    max_groups: int = Field(default=10_000, gt=0, description="groups per (summary, topic, window)")
    max_buckets: int = Field(default=20_000, gt=0, description="histogram buckets per (summary, topic, window, group)")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError(f"expected an identifier (letters, digits, _), got {value!r}")
        return value

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        if not value:
            raise ValueError("expected a topic name or re:<regex>")
        if value.startswith(SUMMARY_PATTERN_PREFIX):
            check_regex(value[len(SUMMARY_PATTERN_PREFIX) :])
        return value

    _paths = field_validator("value")(_check_json_path)

    @field_validator("group_by")
    @classmethod
    def _group_by(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            _check_json_path(path)
        if len(set(value)) != len(value):
            raise ValueError(f"group fields must be distinct, got {list(value)}")
        return value

    @field_validator("percentiles")
    @classmethod
    def _percentiles(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value:
            raise ValueError("expected at least one percentile")
        for q in value:
            if not 0 < q <= 100:
                raise ValueError(f"percentiles must be in (0, 100], got {q}")
        if len(set(value)) != len(value):
            raise ValueError(f"percentiles must be distinct, got {list(value)}")
        return value

    @field_validator("step")
    @classmethod
    def _step(cls, value: float | None) -> float | None:
        # Buckets are multiples of the step's decimal value (kdq.summaries.step_decimal); with at
        # most 3 digits and 1e12 steps they have at most 15 digits, so each is a distinct double.
        if value is not None and len(Decimal(repr(float(value))).normalize().as_tuple().digits) > 3:
            raise ValueError(f"a step has at most 3 significant digits (0.5, 0.25, 10, 0.001), got {value!r}")
        return value

    @model_validator(mode="after")
    def _precision(self) -> SummaryConfig:
        if self.significant_digits is not None and self.step is not None:
            raise ValueError("set either significant_digits or step, not both")
        if self.significant_digits is None and self.step is None:
            object.__setattr__(self, "significant_digits", 3)
        return self

    @property
    def is_pattern(self) -> bool:
        return self.topic.startswith(SUMMARY_PATTERN_PREFIX)

    @property
    def topic_match(self) -> str:
        """The exact name, or the regex without its ``re:`` prefix."""
        return self.topic[len(SUMMARY_PATTERN_PREFIX) :] if self.is_pattern else self.topic

    def matches(self, topic: str) -> bool:
        if self.is_pattern:
            return re.fullmatch(self.topic_match, topic) is not None
        return topic == self.topic
