"""Process configuration: one pydantic-settings model read from ``LLOG_*`` variables and,
optionally, a TOML file (``LLOG_CONFIG_FILE``, ``llog serve --config``) with the same
setting names in lower case; variables win over the file.

Built once at start (``Settings.from_env()``) and passed down explicitly; nothing in the
package reads the environment on its own.

Groups. The fields are declared in groups (app/settings_groups.py: Oxia, S3, the
store's rules, writer, batching, read path, tail cache, compaction, consumer groups,
auth, limits, topics, cluster, server, observability), each field in exactly one, and a
component takes only its group, so what it depends on is in its signature:
``LeanS3(s3: S3Settings)``, ``OxiaStore(oxia: OxiaSettings, ...)``,
``GroupService(..., groups: GroupSettings, ...)``. The writer's and compaction's groups
both extend ``StoreSettings``, the rules every writer and compactor of a store must
share (the retry horizon, the age compaction takes entries at).

Why ``Settings`` stays flat and inherits the groups, rather than nesting them (a field
per group with a before-validator folding flat keys in): the flat model is what
operators and callers see, and it must not change. Inherited fields keep every
``LLOG_*`` name and TOML key a plain field name (nested fields would make
pydantic-settings look for ``LLOG_S3__...`` and TOML tables, or need an alias per
field), keep an error's location the flat field, so the message still names the
variable, and keep ``Settings(**flat)``, ``model_copy(update=...)``, ``as_env()`` and
every ``settings.<field>`` read working as they were. Each field and its own checks are
written once, in its group; the checks that span groups (forwarding with auth, the TLS
pairs, what auth needs) stay here.

``settings.oxia``, ``settings.s3`` and the like (``access`` for auth, whose name
``auth`` is a field; ``consumer_groups``) build that group's model from the validated
values on each call (about 15 µs, paid when a component is built, never per request),
so a copy with updated fields never hands out a stale group. As ``Settings`` is a
subclass of each group, a test or tool may still pass the whole settings where a group
is asked for; the signature still bounds what the component reads (mypy holds it to
the group's fields).
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from app.settings_groups import (
    ALL_ROLES,
    ASYMMETRIC_JWT_ALGORITHMS,
    MAX_PARTITIONS_PER_REQUEST_CEILING,
    MIN_METRICS_TOKEN_CHARS,
    RETRY_HORIZON_SAFE_SHARE,
    ZSTD_LEVELS,
    AuthSettings,
    BatchSettings,
    ClusterSettings,
    CompactionSettings,
    GroupSettings,
    LimitSettings,
    ObservabilitySettings,
    OxiaSettings,
    ReadSettings,
    Role,
    S3Settings,
    ServerSettings,
    StoreSettings,
    TailCacheSettings,
    TopicSettings,
    WriterSettings,
    default_broker_id,
)

# The package imports settings, groups included, from here (app/settings_groups.py is
# where the groups are declared).
__all__ = ["ALL_ROLES", "ASYMMETRIC_JWT_ALGORITHMS", "CONFIG_FILE_ENV",
           "MAX_PARTITIONS_PER_REQUEST_CEILING", "MIN_METRICS_TOKEN_CHARS", "NOT_SETTINGS",
           "RETRY_HORIZON_SAFE_SHARE", "ZSTD_LEVELS", "AuthSettings", "BatchSettings",
           "ClusterSettings", "CompactionSettings", "GroupSettings", "LimitSettings",
           "ObservabilitySettings", "OxiaSettings", "ReadSettings", "Role", "S3Settings",
           "ServerSettings", "Settings", "SettingsError", "StoreSettings", "TailCacheSettings",
           "TopicSettings", "WriterSettings", "default_broker_id", "describe_validation_error"]

CONFIG_FILE_ENV = "LLOG_CONFIG_FILE"
# LLOG_* variables that are read elsewhere and are no settings.
NOT_SETTINGS = frozenset({CONFIG_FILE_ENV, "LLOG_BIN_CACHE_DIR", "LLOG_BROKER_URL",
                          "LLOG_PORT_RANGE", "LLOG_SPARK_LOG_LEVEL", "LLOG_TEST_LOOP_BLOCKER",
                          "LLOG_TEST_LOOP_BLOCK_S"})
# The TOML file of the Settings being built (from_env sets it around the construction).
_config_file: ContextVar[Path | None] = ContextVar("llog_config_file", default=None)


class SettingsError(ValueError):
    """Invalid configuration; the message names each offending ``LLOG_*`` variable."""


class Settings(
    OxiaSettings, S3Settings, WriterSettings, BatchSettings, ReadSettings, TailCacheSettings,
    CompactionSettings, GroupSettings, AuthSettings, LimitSettings, TopicSettings,
    ClusterSettings, ServerSettings, ObservabilitySettings, BaseSettings,
):
    """Every knob of a broker, compactor or job process: the union of the groups."""

    model_config = SettingsConfigDict(
        env_prefix="LLOG_", extra="ignore", frozen=True, validate_default=True
    )

    @model_validator(mode="after")
    def _check_forwarding(self) -> Settings:
        # With access control on, the forward port would otherwise append for anyone
        # who can reach it, past every right checked on /produce.
        if self.affinity == "forward" and self.auth == "on" and self.cluster_secret is None:
            raise ValueError("LLOG_AFFINITY=forward with LLOG_AUTH=on needs "
                             "LLOG_CLUSTER_SECRET (the forward connections' key)")
        return self


    @model_validator(mode="after")
    def _check_security(self) -> Settings:
        oxia_files = (self.oxia_tls_ca_file, self.oxia_tls_cert_file, self.oxia_tls_key_file)
        if not self.oxia_tls and any(f is not None for f in oxia_files):
            raise ValueError("LLOG_OXIA_TLS_*_FILE need LLOG_OXIA_TLS=true")
        if (self.oxia_tls_cert_file is None) != (self.oxia_tls_key_file is None):
            raise ValueError("LLOG_OXIA_TLS_CERT_FILE and LLOG_OXIA_TLS_KEY_FILE go together")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("LLOG_SSL_CERTFILE and LLOG_SSL_KEYFILE go together")
        if self.ssl_client_cert != "none" and self.ssl_ca_certs is None:
            raise ValueError("LLOG_SSL_CLIENT_CERT needs LLOG_SSL_CA_CERTS")
        if self.metrics_token is not None:
            if len(self.metrics_token.get_secret_value()) < MIN_METRICS_TOKEN_CHARS:
                raise ValueError(f"LLOG_METRICS_TOKEN: at least {MIN_METRICS_TOKEN_CHARS} "
                                 "characters (for example: openssl rand -hex 32)")
            if self.auth_metrics == "authenticated":
                raise ValueError("set one of LLOG_METRICS_TOKEN and "
                                 "LLOG_AUTH_METRICS=authenticated")
        if self.auth == "off":
            return self
        if self.auth_file is None:
            raise ValueError("LLOG_AUTH=on needs LLOG_AUTH_FILE (principals and rights)")
        if self.auth_jwks_file is not None and self.auth_jwks_url is not None:
            raise ValueError("set one of LLOG_AUTH_JWKS_FILE and LLOG_AUTH_JWKS_URL")
        if self.jwt_enabled and (self.auth_jwt_issuer is None or self.auth_jwt_audience is None):
            raise ValueError("JWTs (LLOG_AUTH_JWKS_*) need LLOG_AUTH_JWT_ISSUER and "
                             "LLOG_AUTH_JWT_AUDIENCE")
        return self


    @property
    def auth_off_on_purpose(self) -> bool:
        """Auth is off because LLOG_AUTH=off was given (variable, file or argument),
        not by default."""
        return self.auth == "off" and "auth" in self.model_fields_set


    # -- the groups, each a model of its own fields only ------------------------------

    @property
    def oxia(self) -> OxiaSettings:
        return OxiaSettings.model_construct(**self._fields_of(OxiaSettings))

    @property
    def s3(self) -> S3Settings:
        return S3Settings.model_construct(**self._fields_of(S3Settings))

    @property
    def store(self) -> StoreSettings:
        return StoreSettings.model_construct(**self._fields_of(StoreSettings))

    @property
    def writer(self) -> WriterSettings:
        return WriterSettings.model_construct(**self._fields_of(WriterSettings))

    @property
    def batching(self) -> BatchSettings:
        return BatchSettings.model_construct(**self._fields_of(BatchSettings))

    @property
    def read_path(self) -> ReadSettings:
        return ReadSettings.model_construct(**self._fields_of(ReadSettings))

    @property
    def tail_cache(self) -> TailCacheSettings:
        return TailCacheSettings.model_construct(**self._fields_of(TailCacheSettings))

    @property
    def compaction(self) -> CompactionSettings:
        return CompactionSettings.model_construct(**self._fields_of(CompactionSettings))

    @property
    def consumer_groups(self) -> GroupSettings:
        return GroupSettings.model_construct(**self._fields_of(GroupSettings))

    @property
    def access(self) -> AuthSettings:
        """The auth group (``auth`` is the LLOG_AUTH field)."""
        return AuthSettings.model_construct(**self._fields_of(AuthSettings))

    @property
    def limits(self) -> LimitSettings:
        return LimitSettings.model_construct(**self._fields_of(LimitSettings))

    @property
    def topic_rules(self) -> TopicSettings:
        """The topics group (auto-creation, defaults; not the broker's topic directory)."""
        return TopicSettings.model_construct(**self._fields_of(TopicSettings))

    @property
    def cluster(self) -> ClusterSettings:
        return ClusterSettings.model_construct(**self._fields_of(ClusterSettings))

    @property
    def server(self) -> ServerSettings:
        return ServerSettings.model_construct(**self._fields_of(ServerSettings))

    @property
    def observability(self) -> ObservabilitySettings:
        return ObservabilitySettings.model_construct(**self._fields_of(ObservabilitySettings))

    def _fields_of(self, group: type[BaseModel]) -> dict[str, Any]:
        return {name: getattr(self, name) for name in group.model_fields}

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then ``LLOG_*`` variables, then the TOML file (if any)."""
        config_file = _config_file.get()
        toml = (TomlConfigSettingsSource(settings_cls, toml_file=config_file),) \
            if config_file is not None else ()
        return init_settings, env_settings, *toml, dotenv_settings, file_secret_settings

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Read the environment and the TOML file ``LLOG_CONFIG_FILE`` names, if any;
        raise :class:`SettingsError` naming each bad variable, or the file and key of
        each bad value in the file."""
        named = os.environ.get(CONFIG_FILE_ENV)
        config_file = Path(named) if named else None
        in_file = _read_config_file(config_file) if config_file is not None else {}
        token = _config_file.set(config_file)
        try:
            return cls(**overrides)  # type: ignore[arg-type]
        except ValidationError as exc:
            raise SettingsError(describe_validation_error(
                exc, config_file, set(in_file) - set(overrides))) from None
        finally:
            _config_file.reset(token)

    @classmethod
    def unknown_variables(cls, environ: Mapping[str, str]) -> list[str]:
        """A warning for each ``LLOG_*`` variable that names no setting (so it changes
        nothing), with the closest setting's name when one is close."""
        known = {f"LLOG_{name.upper()}" for name in cls.model_fields} | NOT_SETTINGS
        warnings = []
        for name in sorted(environ):
            upper = name.upper()
            if upper.startswith("LLOG_") and upper not in known:
                close = difflib.get_close_matches(upper, known, n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                warnings.append(f"{name} is not a setting and is ignored{hint}")
        return warnings


    @property
    def broker_url(self) -> str:
        """Where clients reach this broker: LLOG_ADVERTISED_URL, else the listener's."""
        if self.advertised_url is not None:
            return self.advertised_url
        scheme = "https" if self.ssl_certfile is not None else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    def as_env(self) -> dict[str, str]:
        """The settings as ``LLOG_*`` variables, for child processes."""
        env: dict[str, str] = {}
        for name, value in self.model_dump().items():
            if value is None:
                value = ""  # every optional setting reads "" as unset
            elif isinstance(value, SecretStr):
                value = value.get_secret_value()
            elif isinstance(value, tuple):
                value = ",".join(value)
            env[f"LLOG_{name.upper()}"] = str(value)
        return env


def describe_validation_error(exc: ValidationError, config_file: Path | None = None,
                              from_file: set[str] | frozenset[str] = frozenset()) -> str:
    """One line per problem, naming the variable, or the file and key it came from."""
    environ = {name.upper() for name in os.environ}
    lines = ["invalid configuration:"]
    for err in exc.errors():
        loc = err.get("loc") or ()
        field = str(loc[0]) if loc else ""
        name = f"LLOG_{field.upper()}" if field else "(settings)"
        if field in from_file and name not in environ:
            name = f"{config_file}: {field}"
        lines.append(f"  {name}: {err.get('msg', 'invalid value')}")
    return "\n".join(lines)


def _read_config_file(path: Path) -> dict[str, Any]:
    """The settings in a TOML file; a file that cannot be read or parsed, or a key that
    names no setting, is a :class:`SettingsError` naming the file (and the key)."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read the configuration file: "
                            f"{exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{path}: not a valid TOML file: {exc}") from None
    fields = set(Settings.model_fields)
    unknown = []
    for key in sorted(set(data) - fields):
        close = difflib.get_close_matches(key, fields, n=1)
        unknown.append(f"  {path}: {key}: not a setting"
                       + (f"; did you mean {close[0]}?" if close else ""))
    if unknown:
        raise SettingsError("\n".join(["invalid configuration:", *unknown]))
    return data
