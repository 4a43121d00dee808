"""Java-properties files, read exactly as ``java.util.Properties.load`` reads them.

Worker, connector and ensemble configs are properties files, and users copy them from
Kafka and ZooKeeper installations. A parser that is "mostly" compatible would silently
change a value (a trailing backslash, a ``\\:`` in a key, a ``!`` comment), so this module
follows the JDK's ``LineReader`` and ``loadConvert`` rule for rule:

* A *natural* line ends at ``\\n``, ``\\r`` or ``\\r\\n`` (and nothing else: Python's
  ``str.splitlines`` would also split at form feeds and U+2028, Java does not).
* Leading whitespace (space, tab, form feed) is skipped. A line that is then empty is
  blank; one that starts with ``#`` or ``!`` is a comment. A comment never continues.
* A line ending in an odd number of backslashes continues on the next natural line,
  whose leading whitespace is skipped; an even number is that many escaped backslashes.
* The key ends at the first unescaped ``=``, ``:`` or whitespace. Whitespace around the
  separator is skipped, and after a whitespace separator one ``=`` or ``:`` may follow.
  Whatever remains, trailing whitespace included, is the value.
* Escapes: ``\\t \\n \\r \\f``, ``\\uXXXX``; a backslash before any other character keeps
  just that character (so ``\\=``, ``\\:``, ``\\ ``, ``\\#``, ``\\!``, ``\\\\``).

Files are read as UTF-8, not ISO-8859-1 as ``Properties.load(InputStream)`` does: that is
what ``Properties.load(Reader)`` sees for a UTF-8 file, and what users' editors write.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Iterator, Mapping

from herder.errors import ConfigError

__all__ = ["dump_properties", "load_properties", "parse_properties"]

#: what Java's Properties treats as whitespace; notably not vertical tab or U+00A0
_WHITESPACE = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_ESCAPED_AS = {char: "\\" + letter for letter, char in _ESCAPES.items()}
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def parse_properties(text: str, *, source: str = "<string>") -> dict[str, str]:
    """Parse properties text into a dict in file order; a later key overrides an earlier one.

    ``source`` names the text in error messages (``load_properties`` passes the path), so
    a malformed ``\\uXXXX`` escape is reported as ``worker.properties, line 7: ...``.
    """
    result: dict[str, str] = {}
    for line_number, line in _logical_lines(text):
        key, value = _split_key_value(line)
        try:
            result[_unescape(key)] = _unescape(value)
        except ValueError as exc:
            raise ConfigError(f"{source}, line {line_number}: {exc}") from None
    return result


def load_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a UTF-8 properties file; every way of failing is one ConfigError line."""
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8", newline="") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"Properties file not found: {name}") from None
    except IsADirectoryError:
        raise ConfigError(f"Properties file is a directory: {name}") from None
    except PermissionError:
        raise ConfigError(f"Properties file is not readable (permission denied): {name}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"Properties file is not valid UTF-8: {name} (byte offset {exc.start})"
        ) from None
    except OSError as exc:
        raise ConfigError(f"Cannot read properties file {name}: {exc.strerror}") from None
    return parse_properties(text, source=name)


def dump_properties(mapping: Mapping[str, str]) -> str:
    """Write ``mapping`` as properties text that parses back to exactly ``mapping``.

    The output escapes only what must be escaped, so it stays readable (``host:port``
    values are written as they are, where Java's ``store`` would write ``host\\:port``);
    Java's ``load`` reads it back to the same strings. Characters that are not printable
    (controls, line and paragraph separators, unassigned code points) are written as
    ``\\uXXXX`` so an editor can never turn them into something else. (The one string
    that does not round-trip is a Python string holding a high and a low surrogate as two
    code points, which no UTF-8 text can hold: it reads back as the one character.)
    """
    lines = [
        f"{_escape(key, is_key=True)}={_escape(value, is_key=False)}\n"
        for key, value in mapping.items()
    ]
    return "".join(lines)


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Yield ``(line number, logical line)`` with continuations joined, as Java's LineReader.

    The returned line still holds its escapes (only the continuation backslash is
    removed), because the key/value split must see which separators are escaped.

    Two JDK (9 and later) quirks are kept on purpose. While a logical line has no
    content yet — a line holding only a continuation backslash — the next natural line
    is read as a fresh start, so it can be blank or a comment. And such an empty line
    at the very end of the text is an entry (the empty key), unless a ``\\r\\n`` ends it:
    Java looks ahead for the ``\\n`` and meets the end of input first.
    """
    pos, end, line_number = 0, len(text), 1
    parts: list[str] = []
    start_number = 1
    while pos < end:
        pos = _skip_whitespace(text, pos)
        line_end = _find_line_end(text, pos)
        chunk = text[pos:line_end]
        pos, line_number = _after_line_end(text, line_end), line_number + 1
        has_content = any(parts)
        if not has_content and (not chunk or chunk[0] in "#!"):
            continue  # blank or comment, even when it ends in a backslash
        if has_content and not chunk:
            # a blank continuation line ends the logical line
            yield start_number, "".join(parts)
            parts = []
            continue
        if not has_content:
            start_number = line_number - 1
        if not _ends_with_odd_backslashes(chunk):
            yield start_number, "".join([*parts, chunk])
            parts = []
            continue
        parts.append(chunk[:-1])
        if pos == end and not text.startswith("\r\n", line_end):
            yield start_number, "".join(parts)  # a continuation into nothing
            return
    if any(parts):
        yield start_number, "".join(parts)


def _skip_whitespace(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    return pos


def _find_line_end(text: str, pos: int) -> int:
    """Index of the ``\\r`` or ``\\n`` ending the natural line at ``pos`` (or the end)."""
    cr, lf = text.find("\r", pos), text.find("\n", pos)
    ends = [i for i in (cr, lf) if i >= 0]
    return min(ends) if ends else len(text)


def _after_line_end(text: str, line_end: int) -> int:
    if text.startswith("\r\n", line_end):
        return line_end + 2
    return min(line_end + 1, len(text))


def _ends_with_odd_backslashes(chunk: str) -> bool:
    return (len(chunk) - len(chunk.rstrip("\\"))) % 2 == 1


def _split_key_value(line: str) -> tuple[str, str]:
    """Split a logical line at its first unescaped separator, as ``Properties.load0`` does."""
    key_end, value_start, has_separator = len(line), len(line), False
    escaped = False
    for i, c in enumerate(line):
        if not escaped and c in "=:":
            key_end, value_start, has_separator = i, i + 1, True
            break
        if not escaped and c in _WHITESPACE:
            key_end, value_start = i, i + 1
            break
        escaped = c == "\\" and not escaped
    while value_start < len(line):
        c = line[value_start]
        if c not in _WHITESPACE:
            if has_separator or c not in "=:":
                break
            has_separator = True  # "key = value": the = after the whitespace separator
        value_start += 1
    return line[:key_end], line[value_start:]


def _unescape(raw: str) -> str:
    """Resolve escapes; ``ValueError`` for a malformed ``\\uXXXX``.

    Consecutive ``\\uD83D\\uDE00`` escapes are one UTF-16 surrogate pair in Java and
    become the one character they encode; a lone surrogate stays as Java keeps it.
    """
    if "\\" not in raw:
        return raw
    out: list[str] = []
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        i += 1
        if c != "\\":
            out.append(c)
            continue
        if i == n:
            break  # unreachable from parse_properties, which drops a dangling backslash
        c = raw[i]
        i += 1
        if c != "u":
            out.append(_ESCAPES.get(c, c))
            continue
        digits = raw[i : i + 4]
        if len(digits) < 4 or not _HEX_DIGITS.issuperset(digits):
            raise ValueError(f"malformed \\uXXXX escape '\\u{digits}' (needs four hex digits)")
        i += 4
        code = int(digits, 16)
        if 0xDC00 <= code <= 0xDFFF and out and "\ud800" <= out[-1] <= "\udbff":
            high = ord(out.pop())
            code = 0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00)
        out.append(chr(code))
    return "".join(out)


def _escape(text: str, *, is_key: bool) -> str:
    """Escape ``text`` so ``_split_key_value`` and ``_unescape`` give it back unchanged."""
    out: list[str] = []
    for i, c in enumerate(text):
        if c == "\\":
            out.append("\\\\")
        elif c in _ESCAPED_AS:
            out.append(_ESCAPED_AS[c])
        elif c == " " and (is_key or i == 0):
            # a space ends a key; a value's leading spaces would be skipped as separator
            out.append("\\ ")
        elif is_key and c in "=:":
            out.append("\\" + c)
        elif is_key and i == 0 and c in "#!":
            out.append("\\" + c)  # would make the whole line a comment
        elif not _is_printable(c):
            out.append(_unicode_escape(c))
        else:
            out.append(c)
    return "".join(out)


def _is_printable(c: str) -> bool:
    # Cc/Cf/Cs/Co/Cn (controls, format, surrogates, private use, unassigned) and the
    # Z* separators other than a plain space are invisible or break lines in editors
    category = unicodedata.category(c)
    return not (category.startswith("C") or (category.startswith("Z") and c != " "))


def _unicode_escape(c: str) -> str:
    code = ord(c)
    if code <= 0xFFFF:
        return f"\\u{code:04X}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04X}\\u{0xDC00 + (code & 0x3FF):04X}"
