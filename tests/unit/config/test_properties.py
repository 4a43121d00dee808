"""Java-properties parsing: the cases where a "nearly compatible" parser changes a value.

The expected results are what ``java.util.Properties.load`` (JDK 17) returns for the
same text; they were checked against it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herder.config import dump_properties, load_properties, parse_properties
from herder.errors import ConfigError, ErrorCode

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "line",
    [
        "key=value",
        "key:value",
        "key value",
        "key\tvalue",
        "key\fvalue",
        "key = value",
        "key  :  value",
        "key \t= value",
        "   key=value",
        "\t\fkey value",
    ],
)
def test_every_separator_form_gives_the_same_entry(line: str) -> None:
    assert parse_properties(line) == {"key": "value"}


def test_only_the_first_separator_after_whitespace_is_consumed() -> None:
    assert parse_properties("a = = b") == {"a": "= b"}
    assert parse_properties("a : : b") == {"a": ": b"}
    assert parse_properties("a==b") == {"a": "=b"}
    assert parse_properties("a b = c") == {"a": "b = c"}


def test_the_first_unescaped_separator_ends_the_key() -> None:
    assert parse_properties("url=jdbc:pg://h:5432/db?x=1") == {"url": "jdbc:pg://h:5432/db?x=1"}
    assert parse_properties("a:b=c") == {"a": "b=c"}


def test_escaped_separators_stay_in_the_key() -> None:
    text = "a\\=b=1\nc\\:d:2\ne\\ f 3\ng\\\th=4"
    assert parse_properties(text) == {"a=b": "1", "c:d": "2", "e f": "3", "g\th": "4"}


def test_escapes_in_values() -> None:
    parsed = parse_properties(r"k=tab\tnl\ncr\rff\fbs\\eq\=co\:sp\ hash\#bang\!other\q\b")
    assert parsed == {"k": "tab\tnl\ncr\rff\fbs\\eq=co:sp hash#bang!otherqb"}


def test_an_escaped_leading_space_is_kept_in_the_value() -> None:
    assert parse_properties("k=\\  two spaces") == {"k": "  two spaces"}


def test_unicode_escapes() -> None:
    assert parse_properties("caf\\u00e9=\\u00E9t\\u00e9") == {"café": "été"}
    assert parse_properties("k=\\u003d") == {"k": "="}


def test_unicode_escapes_of_a_surrogate_pair_make_one_character() -> None:
    assert parse_properties("smile=\\uD83D\\uDE00") == {"smile": "\U0001f600"}


@pytest.mark.parametrize(
    "text", ["k=\\u00g1", "k=\\u12", "k=abc\\u", "\\uzzzz=v", "k=\\u12\\\n\n  34"]
)
def test_a_malformed_unicode_escape_names_the_line(text: str) -> None:
    with pytest.raises(ConfigError, match=r"line 1: malformed \\uXXXX") as info:
        parse_properties(text)
    assert info.value.code is ErrorCode.INVALID_CONFIG


def test_a_unicode_escape_may_span_a_continuation() -> None:
    # continuations are joined before escapes are read, as in Java
    assert parse_properties("k=\\u00\\\n   e9") == {"k": "é"}


def test_a_malformed_unicode_escape_names_the_line_where_its_entry_starts() -> None:
    text = "# comment\n\nfine=1\nbad=\\\n  \\u12zz\n"
    with pytest.raises(ConfigError, match=r"^settings\.properties, line 4: "):
        parse_properties(text, source="settings.properties")


def test_continuation_lines_are_joined_without_their_leading_whitespace() -> None:
    text = "fruits = apple, \\\n         banana, \\\n\t\tpear\nnext=1"
    assert parse_properties(text) == {"fruits": "apple, banana, pear", "next": "1"}


def test_a_continuation_can_split_the_key() -> None:
    assert parse_properties("ke\\\n   y=v") == {"key": "v"}


def test_an_even_number_of_trailing_backslashes_is_not_a_continuation() -> None:
    text = "path=C:\\\\dir\\\\\nnext=1"
    assert parse_properties(text) == {"path": "C:\\dir\\", "next": "1"}


def test_three_trailing_backslashes_are_one_escaped_backslash_and_a_continuation() -> None:
    assert parse_properties("k=a\\\\\\\n  b") == {"k": "a\\b"}


def test_a_continued_line_starting_with_a_comment_character_is_content() -> None:
    assert parse_properties("k=a\\\n  #not a comment") == {"k": "a#not a comment"}


def test_a_blank_continuation_line_ends_the_entry() -> None:
    assert parse_properties("k=a\\\n   \nnext=1") == {"k": "a", "next": "1"}


def test_a_trailing_backslash_at_the_end_of_the_text_is_dropped() -> None:
    assert parse_properties("k=v\\") == {"k": "v"}


def test_comments_with_hash_and_bang() -> None:
    text = "# a comment\n! another\n   # indented comment\n\t!indented bang\nk=v"
    assert parse_properties(text) == {"k": "v"}


def test_a_comment_ending_in_a_backslash_does_not_continue() -> None:
    assert parse_properties("# comment \\\nk=v") == {"k": "v"}


def test_hash_and_bang_inside_a_value_or_key_are_content() -> None:
    assert parse_properties("color=#ff0000 # not a comment") == {"color": "#ff0000 # not a comment"}
    assert parse_properties("a#b=c!d") == {"a#b": "c!d"}


def test_escaped_hash_starts_a_key_rather_than_a_comment() -> None:
    assert parse_properties("\\#k=v\n\\!b=w") == {"#k": "v", "!b": "w"}


def test_empty_values_and_keys_without_values() -> None:
    text = "empty=\nempty.colon:\nbare\nbare.spaced   \nempty.spaced =   "
    assert parse_properties(text) == {
        "empty": "",
        "empty.colon": "",
        "bare": "",
        "bare.spaced": "",
        "empty.spaced": "",
    }


def test_an_empty_key() -> None:
    assert parse_properties("=v") == {"": "v"}


def test_trailing_whitespace_in_values_is_preserved() -> None:
    assert parse_properties("k=v  \t\nk2 = a b ") == {"k": "v  \t", "k2": "a b "}


def test_line_endings_lf_cr_and_crlf() -> None:
    assert parse_properties("a=1\r\nb=2\rc=3\nd=4") == {"a": "1", "b": "2", "c": "3", "d": "4"}


def test_crlf_continuation_and_crlf_blank_lines() -> None:
    text = "a=x\\\r\n   y\r\n\r\n# c\r\nb=2\r\n"
    assert parse_properties(text) == {"a": "xy", "b": "2"}


def test_only_cr_and_lf_end_lines() -> None:
    # Python's splitlines would also split at these; Java does not
    assert parse_properties("k=a\x0bb\x1cc\u2028d") == {"k": "a\x0bb\x1cc\u2028d"}


def test_blank_lines_and_whitespace_only_lines_are_skipped() -> None:
    assert parse_properties("\n\n   \n\t\f\na=1\n\n") == {"a": "1"}
    assert parse_properties("") == {}


def test_later_keys_override_earlier_and_first_appearance_fixes_order() -> None:
    parsed = parse_properties("b=1\na=2\nb=3")
    assert parsed == {"b": "3", "a": "2"}
    assert list(parsed) == ["b", "a"]


def test_jdk_quirk_a_line_of_only_a_continuation_starts_afresh() -> None:
    # after "\" nothing has been read yet, so the next line may still be a comment
    assert parse_properties("\\\n# comment\nk=v") == {"k": "v"}
    assert parse_properties("\\\nk=v") == {"k": "v"}


def test_jdk_quirk_a_lone_continuation_at_the_end_is_the_empty_key() -> None:
    assert parse_properties("k=v\n\\") == {"k": "v", "": ""}
    assert parse_properties("k=v\n\\\n") == {"k": "v", "": ""}
    assert parse_properties("k=v\n\\\r\n") == {"k": "v"}


def test_load_properties_reads_utf8(tmp_path: Path) -> None:
    path = tmp_path / "worker.properties"
    path.write_bytes("name=café\r\nkey=\\u00e9\n".encode())
    assert load_properties(path) == {"name": "café", "key": "é"}
    assert load_properties(str(path)) == {"name": "café", "key": "é"}


def test_load_properties_missing_file_is_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "nope.properties"
    with pytest.raises(ConfigError) as info:
        load_properties(path)
    assert str(info.value) == f"Properties file not found: {path}"
    assert info.value.code is ErrorCode.INVALID_CONFIG


def test_load_properties_directory_and_bad_encoding(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_properties(tmp_path)
    latin1 = tmp_path / "latin1.properties"
    latin1.write_bytes("k=caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        load_properties(latin1)


def test_load_properties_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.properties"
    path.write_text("a=1\nb=\\uXYZW\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad\.properties, line 2: malformed"):
        load_properties(path)


def test_dump_escapes_only_what_it_must() -> None:
    text = dump_properties({"bootstrap.servers": "localhost:9092", "color": "#fff = white"})
    assert text == "bootstrap.servers=localhost:9092\ncolor=#fff = white\n"


def test_dump_escapes_separators_in_keys_and_awkward_characters() -> None:
    mapping = {
        "a key=with:seps": " leading space",
        "#comment-like": "tab\there",
        "!bang": "line\nbreak\\",
        "": "",
        "ctrl": "\x00\u2028",
    }
    text = dump_properties(mapping)
    assert text.splitlines()[0] == "a\\ key\\=with\\:seps=\\ leading space"
    assert "\\u0000\\u2028" in text
    assert parse_properties(text) == mapping


def test_load_reads_what_dump_wrote(tmp_path: Path) -> None:
    mapping = {"name": "café ☕", "secret": "p@ss:w=rd\\", "smile": "\U0001f600"}
    path = tmp_path / "out.properties"
    path.write_text(dump_properties(mapping), encoding="utf-8")
    assert load_properties(path) == mapping


@given(st.dictionaries(st.text(), st.text(), max_size=8))
def test_parse_of_dump_is_identity(mapping: dict[str, str]) -> None:
    assert parse_properties(dump_properties(mapping)) == mapping


@given(
    st.dictionaries(
        st.text(alphabet=st.sampled_from(" \t\f\\=:#!\r\nab\x0b\u2028é"), max_size=6),
        st.text(alphabet=st.sampled_from(" \t\f\\=:#!\r\nab\x0b\u2028é"), max_size=6),
        max_size=6,
    )
)
def test_parse_of_dump_is_identity_on_awkward_characters(mapping: dict[str, str]) -> None:
    assert parse_properties(dump_properties(mapping)) == mapping
