"""Loading the configuration: a TOML file plus ``KDQ_<SECTION>__<KEY>`` environment variables plus overrides become
one :class:`~kdq.config.model.Config`, or a :class:`~kdq.config.errors.ConfigError` naming each bad key, where it
came from (the file, a variable, the overrides) and the problem."""

from __future__ import annotations

import difflib
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kdq.config.errors import ConfigError, redact, scrub, secret_values
from kdq.config.model import Config
from kdq.config.sections import (
    InfluxConfig,
    KafkaConfig,
    PathsConfig,
    RegistryConfig,
    Section,
    SparkConfig,
    StreamConfig,
)

ENV_PREFIX = "KDQ_"
CONFIG_FILE_ENV = "KDQ_CONFIG"
DEFAULT_CONFIG_NAME = "kdq.toml"


_SECTIONS: dict[str, type[Section]] = {
    "paths": PathsConfig,
    "kafka": KafkaConfig,
    "spark": SparkConfig,
    "stream": StreamConfig,
    "influxdb": InfluxConfig,
    "registry": RegistryConfig,
}


def _suggest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _merge_env(raw: dict[str, dict[str, Any]], env: Mapping[str, str], origins: dict[str, str]) -> None:
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX) :].lower().partition("__")
        if section == "summaries":
            raise ConfigError(f"{name}: summaries are defined in the config file only ([[summaries]] tables)")
        if section not in _SECTIONS:
            raise ConfigError(f"{name}: unknown section {section!r}{_suggest(section, list(_SECTIONS))}")
        fields = _SECTIONS[section].model_fields
        if key not in fields:
            raise ConfigError(f"{name}: unknown key {section}.{key}{_suggest(key, list(fields))}")
        annotation = str(fields[key].annotation)
        parsed: Any = value
        if annotation.startswith("dict"):
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError as exc:
                # Not the value itself: such settings hold passwords (sasl.jaas.config, spark.authenticate.secret).
                raise ConfigError(
                    f"{name}: expected a JSON object ({exc.msg} at character {exc.pos}; the value is not shown, "
                    "it may hold secrets)"
                ) from None
        raw.setdefault(section, {})[key] = parsed
        origins[f"{section}.{key}"] = name


def find_config_file(env: Mapping[str, str]) -> Path | None:
    """KDQ_CONFIG, else kdq.toml in the working directory or its parents, else the project's own."""
    if env.get(CONFIG_FILE_ENV):
        path = Path(env[CONFIG_FILE_ENV]).expanduser()
        if not path.is_file():
            raise ConfigError(f"{CONFIG_FILE_ENV}={path}: no such file")
        return path.resolve()
    cwd = Path.cwd()
    for folder in (cwd, *cwd.parents):
        if (folder / DEFAULT_CONFIG_NAME).is_file():
            return (folder / DEFAULT_CONFIG_NAME).resolve()
    project = Path(__file__).resolve().parents[3] / DEFAULT_CONFIG_NAME
    return project if project.is_file() else None


def load_config(
    path: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """File (``path`` or :func:`find_config_file`) + environment + ``overrides`` → frozen Config."""
    env = os.environ if env is None else env
    file = Path(path).resolve() if path is not None else find_config_file(env)
    raw: dict[str, dict[str, Any]] = {}
    origins: dict[str, str] = {}
    if file is not None:
        try:
            data = tomllib.loads(file.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"{file}: no such config file") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
        for section, values in data.items():
            if section == "summaries":
                if not isinstance(values, list) or not all(isinstance(v, dict) for v in values):
                    raise ConfigError(f"{file}: summaries must be an array of tables ([[summaries]])")
                raw[section] = [dict(v) for v in values]
                for i in range(len(values)):
                    origins[f"summaries.{i}"] = str(file)
                continue
            if section not in _SECTIONS:
                raise ConfigError(f"{file}: unknown section [{section}]{_suggest(section, list(_SECTIONS))}")
            if not isinstance(values, dict):
                raise ConfigError(f"{file}: [{section}] must be a table")
            fields = _SECTIONS[section].model_fields
            for key in values:
                if key not in fields:
                    raise ConfigError(f"{file}: unknown key {section}.{key}{_suggest(key, list(fields))}")
                origins[f"{section}.{key}"] = str(file)
            raw[section] = dict(values)
    _merge_env(raw, env, origins)
    for section, values in (overrides or {}).items():
        if section == "summaries":
            raw[section] = [dict(v) for v in values]  # a list replaces the file's, it is not merged
            origins.update({f"summaries.{i}": "overrides" for i in range(len(values))})
            continue
        raw.setdefault(section, {}).update(values)
        for key in values:
            origins[f"{section}.{key}"] = "overrides"
    base_dir = file.parent if file is not None else Path.cwd()
    try:
        return Config(base_dir=base_dir, source=str(file or "defaults"), **raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = [str(part) for part in err["loc"]]
            origin = origins.get(".".join(loc[:2]), "defaults")
            if loc[:1] == ["summaries"] and len(loc) >= 2 and loc[1].isdigit():
                entry = raw["summaries"][int(loc[1])]
                named = f" (name {entry['name']!r})" if isinstance(entry, dict) and "name" in entry else ""
                loc = [f"summaries[{loc[1]}]{named}", *loc[2:]]
            if not loc:  # a check across sections (Config's own validator): its message names the keys
                problems.append(str(err["msg"]).removeprefix("Value error, "))
                continue
            problems.append(f"{'.'.join(loc)} (from {origin}): {err['msg']}, got {redact('.'.join(loc), err.get('input'))!r}")
        message = "invalid configuration:\n  " + "\n  ".join(problems)
        raise ConfigError(scrub(message, secret_values(raw))) from None
