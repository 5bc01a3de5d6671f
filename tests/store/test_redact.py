"""redact_dsn and redact_secrets: passwords out of DSNs and free text."""

from __future__ import annotations

import pytest
from watchkeeper.store.backend import redact_dsn, redact_secrets


class TestRedactDsn:
    @pytest.mark.parametrize(
        ("dsn", "shown"),
        [
            ("postgresql://app:hunter2@db:5432/wk", "postgresql://app:***@db:5432/wk"),
            ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
            ("postgresql://app:p@ss@db/wk", "postgresql://app:***@db/wk"),
            (
                "postgresql://db/wk?user=app&password=hunter2&sslmode=require",
                "postgresql://db/wk?user=app&password=***&sslmode=require",
            ),
            ("postgresql://db/wk?sslpassword=hunter2", "postgresql://db/wk?sslpassword=***"),
            (
                "host=db user=app password=hunter2 dbname=wk",
                "host=db user=app password=*** dbname=wk",
            ),
            ("host=db password = 'hun ter\\'2' port=5432", "host=db password=*** port=5432"),
            ("postgresql://app@db/wk", "postgresql://app@db/wk"),
            ("sqlite:///watchkeeper.db", "sqlite:///watchkeeper.db"),
        ],
    )
    def test_the_password_is_masked_and_the_rest_kept(self, dsn: str, shown: str) -> None:
        """URL userinfo, ?password= and keyword-DSN passwords become ***; the rest stays."""
        assert redact_dsn(dsn) == shown

    @pytest.mark.parametrize(
        "dsn",
        [
            "app:hunter2@db",  # no scheme: not a URL, not key=value
            "postgresql://app:hunter2@db:port/wk",  # a port that is not a number
            "postgresql://app:hunter2@[::1/wk",  # an unclosed IPv6 bracket
            "postgresql://app:hunter 2@db/wk",  # a space
            "host=db password='hunter2",  # an unclosed quote
            "",
        ],
    )
    def test_a_dsn_that_does_not_parse_is_never_echoed(self, dsn: str) -> None:
        """Text that is neither a URL nor a keyword DSN comes back as a marker, not itself."""
        assert redact_dsn(dsn) == "<unparsable dsn>"


class TestRedactSecrets:
    @pytest.mark.parametrize(
        ("text", "shown"),
        [
            (
                "cannot reach redis://:hunter2@cache:6379/0: refused",
                "cannot reach redis://:***@cache:6379/0: refused",
            ),
            (
                "<mine.Watcher(url='postgresql://a:hunter2@db/x', n=1)>",
                "<mine.Watcher(url='postgresql://a:***@db/x', n=1)>",
            ),
            (
                "ConnectionParameters(user='app', password='hunter2', database='wk')",
                "ConnectionParameters(user='app', password=***, database='wk')",
            ),
            ('{"dsn": "host=db password=\\"hunter2\\""}', '{"dsn": "host=db password=***"}'),
            ("?db_password=hunter2&x=1", "?db_password=***&x=1"),
        ],
    )
    def test_every_password_in_the_text_is_masked(self, text: str, shown: str) -> None:
        """URLs with a password and password=value pairs are masked wherever they appear."""
        assert redact_secrets(text) == shown

    def test_text_without_secrets_is_unchanged(self) -> None:
        """Mail addresses, ports and plain key=value pairs are left alone."""
        text = "mail ops@example.com; see http://db:5432/wk?mode=ro; retries=3"
        assert redact_secrets(text) == text
