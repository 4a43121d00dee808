"""Configuration: properties files, declared and validated keys, and secret providers.

* ``properties`` reads and writes Java-properties text exactly as Java does;
* ``ConfigDef`` declares keys (type, default, validators, UI metadata) and parses or
  validates raw values against them, with Kafka's semantics and messages;
* ``Config`` wraps a definition and the user's properties with typed accessors;
* ``resolve`` substitutes ``${env:NAME}`` / ``${file:path:key}`` references.
"""

from herder.config.abstract import Config
from herder.config.definition import (
    NO_DEFAULT,
    ConfigDef,
    ConfigKey,
    ConfigValue,
    Importance,
    InvalidConfiguration,
    Recommender,
    Width,
)
from herder.config.parsing import Password, Type, convert_to_string, invalid_value, parse_type
from herder.config.properties import dump_properties, load_properties, parse_properties
from herder.config.providers import (
    DEFAULT_PROVIDERS,
    ConfigProvider,
    DirectoryConfigProvider,
    EnvVarConfigProvider,
    FileConfigProvider,
    has_references,
    resolve,
    restore_references,
)
from herder.config.validators import (
    CaseInsensitiveValidString,
    Check,
    NonEmptyString,
    NonEmptyStringWithoutControlChars,
    Range,
    Validator,
    ValidList,
    ValidString,
)

__all__ = [
    "DEFAULT_PROVIDERS",
    "NO_DEFAULT",
    "CaseInsensitiveValidString",
    "Check",
    "Config",
    "ConfigDef",
    "ConfigKey",
    "ConfigProvider",
    "ConfigValue",
    "DirectoryConfigProvider",
    "EnvVarConfigProvider",
    "FileConfigProvider",
    "Importance",
    "InvalidConfiguration",
    "NonEmptyString",
    "NonEmptyStringWithoutControlChars",
    "Password",
    "Range",
    "Recommender",
    "Type",
    "ValidList",
    "ValidString",
    "Validator",
    "Width",
    "convert_to_string",
    "dump_properties",
    "has_references",
    "invalid_value",
    "load_properties",
    "parse_properties",
    "parse_type",
    "resolve",
    "restore_references",
]
