"""The value checks every edge uses (`anvil_ctl.core.validate`): each refuses with what was expected."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.validate import (
    MAX_PERSON,
    check_duration,
    check_int,
    check_person,
    check_text,
    check_token,
    check_url,
    escape_text,
    is_loopback,
    parse_rfc3339,
    require,
    split_binding,
    utc_stamp,
)


class TestCheckText:
    @pytest.mark.parametrize(
        "bad",
        [
            "op\nFORGED",
            "\x1b[31mred",
            "r\x1b[2J",
            "a\u202eb",
            "a\u2066b",
            "zero\u200bwidth",
            "bom\ufeff",
            "\x00",
            "del\x7f",
        ],
    )
    def test_control_bidi_and_invisible_characters_are_refused(self, bad: str) -> None:
        with pytest.raises(ValueError, match="expected text without control, bidi or invisible"):
            check_text(bad)

    def test_the_message_names_the_character_without_containing_it(self) -> None:
        with pytest.raises(ValueError) as err:
            check_text("a\x1bb")
        assert "U+001B (escape)" in str(err.value) and "\x1b" not in str(err.value)

    def test_accented_and_non_latin_text_is_accepted(self) -> None:
        assert check_text("José Ñúñez 山田") == "José Ñúñez 山田"

    def test_multiline_allows_newline_and_tab_only(self) -> None:
        assert check_text("a\n\tb", multiline=True) == "a\n\tb"
        with pytest.raises(ValueError):
            check_text("a\rb", multiline=True)

    def test_length_is_bounded(self) -> None:
        with pytest.raises(ValueError, match="at most 10 characters"):
            check_text("x" * 11, max_len=10)


class TestCheckPerson:
    def test_a_name_is_stripped_non_empty_and_bounded(self) -> None:
        assert check_person("  alice ") == "alice"
        with pytest.raises(ValueError, match="non-empty"):
            check_person("   ")
        with pytest.raises(ValueError, match=f"at most {MAX_PERSON}"):
            check_person("a" * 100_000)


class TestCheckToken:
    @pytest.mark.parametrize("bad", ["a b", "a\nb", "tök", "a\tb", "", "x" * 5000, "a\x7fb"])
    def test_anything_but_printable_ascii_without_spaces_is_refused(self, bad: str) -> None:
        with pytest.raises(ValueError):
            check_token(bad)

    def test_the_message_never_contains_the_token(self) -> None:
        with pytest.raises(ValueError) as err:
            check_token("s3cr3t value")
        assert "s3cr3t" not in str(err.value)

    def test_a_typical_token_passes(self) -> None:
        assert check_token("sk-AbC_123.x~=") == "sk-AbC_123.x~="


class TestNumbers:
    def test_integers_are_bounded_and_bool_is_no_integer(self) -> None:
        assert check_int(5, lo=1, hi=10) == 5
        for bad in (0, 11, 10**30, -5):
            with pytest.raises(ValueError):
                check_int(bad, lo=1, hi=10)
        with pytest.raises(ValueError):
            check_int(True, lo=0, hi=10)

    @pytest.mark.parametrize("bad", [float("inf"), float("nan"), 0.0, -1.0, 1e9])
    def test_durations_are_finite_positive_and_bounded(self, bad: float) -> None:
        with pytest.raises(ValueError, match="finite number of seconds"):
            check_duration(bad)


class TestRfc3339:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("2026-09-02", datetime(2026, 9, 2, tzinfo=UTC)),
            ("2026-09-02T12:00:00Z", datetime(2026, 9, 2, 12, tzinfo=UTC)),
            ("2026-09-02T14:00:00+02:00", datetime(2026, 9, 2, 12, tzinfo=UTC)),
            ("2026-09-02T12:00:00.123456789Z", datetime(2026, 9, 2, 12, 0, 0, 123456, tzinfo=UTC)),
            ("2026-09-02T12:00:00", datetime(2026, 9, 2, 12, tzinfo=UTC)),
        ],
    )
    def test_dates_and_date_times_parse_to_utc(self, text: str, expected: datetime) -> None:
        assert parse_rfc3339(text) == expected

    @pytest.mark.parametrize(
        "bad",
        [
            "notadate",
            "2026-13-01",
            "2026-02-30",
            "20260902",
            "2026-W36",
            "2026-09-02T25:00:00Z",
            "٢٠٢٦-٠٩-٠٢",
        ],
    )
    def test_anything_else_is_refused(self, bad: str) -> None:
        with pytest.raises(ValueError, match="RFC 3339"):
            parse_rfc3339(bad)

    def test_the_database_form_compares_as_a_string(self) -> None:
        assert utc_stamp(parse_rfc3339("2026-09-02")) == "2026-09-02T00:00:00.000000Z"


class TestBindingsAndUrls:
    @pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST"])
    def test_ipv4_and_ipv6_loopback_are_loopback(self, host: str) -> None:
        assert is_loopback(host)

    @pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.1", "::", "example.com"])
    def test_other_hosts_are_not(self, host: str) -> None:
        assert not is_loopback(host)

    def test_bindings_split_with_and_without_brackets(self) -> None:
        assert split_binding("[::1]:8001") == ("::1", 8001)
        assert split_binding("127.0.0.1:8001") == ("127.0.0.1", 8001)

    @pytest.mark.parametrize(
        "bad", ["::1:8001", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:99999", ":8001", "h:²"]
    )
    def test_malformed_bindings_are_refused(self, bad: str) -> None:
        with pytest.raises(ValueError):
            split_binding(bad)

    @pytest.mark.parametrize(
        "bad", ["ftp://h:1", "not a url", "http://", "http://h:99999", "http://h:x", "h:80", "http://a\x1b:1"]
    )
    def test_urls_need_a_known_scheme_a_host_and_a_valid_port(self, bad: str) -> None:
        with pytest.raises(ValueError):
            check_url(bad)

    def test_a_url_with_credentials_is_refused_without_echoing_them(self) -> None:
        with pytest.raises(ValueError) as err:
            check_url("http://admin:hunter2@127.0.0.1:30000")
        assert "hunter2" not in str(err.value)

    def test_unix_sockets_where_allowed(self) -> None:
        assert check_url("unix:///run/docker.sock", schemes=("unix",)) == "unix:///run/docker.sock"


class TestEscapeText:
    def test_control_and_bidi_characters_become_visible_escapes(self) -> None:
        assert escape_text("op\n\x1b[31mX\u202e") == "op\\n\\x1b[31mX\\u202e"

    def test_printable_text_is_unchanged(self) -> None:
        assert escape_text("José 山田 a\\b") == "José 山田 a\\b"


class TestRequire:
    def test_a_failed_check_becomes_bad_input_naming_the_flag(self) -> None:
        with pytest.raises(BadInput, match="--approved-by: expected a non-empty value") as err:
            require("--approved-by", check_person, " ")
        assert err.value.data["field"] == "approved_by"
