"""redact_dsn and redact_secrets: passwords out of DSNs and free text."""

from __future__ import annotations

import pytest
from watchkeeper.store.protocols import redact_dsn, redact_secrets


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


class TestOneRuleForUrls:
    @pytest.mark.parametrize(
        "name",
        [
            "password",
            "passwd",
            "pwd",
            "secret",
            "token",
            "access_token",
            "api_key",
            "apikey",
            "key",
            "signature",
            "sig",
            "auth",
            "API_KEY",
            "Access_Token",
            "client_secret",
            "refresh_token",
            "x-api-key",
            "X-Amz-Signature",
        ],
    )
    def test_a_credential_parameter_is_masked_in_urls_and_text(self, name: str) -> None:
        """Each credential parameter (any case) is masked by both tools, the others kept."""
        url = f"https://api.example/v1?page=2&{name}=s3cr3t&n=1"
        shown = f"https://api.example/v1?page=2&{name}=***&n=1"
        assert redact_dsn(url) == shown
        assert redact_secrets(f"GET {url} failed") == f"GET {shown} failed"
        assert redact_secrets(f'{{"url": "/v1?{name}=s3cr3t"}}') == f'{{"url": "/v1?{name}=***"}}'

    @pytest.mark.parametrize("name", ["monkey", "keyboard", "cursor", "sort_key", "author"])
    def test_other_parameters_are_kept(self, name: str) -> None:
        """Names that only contain a short credential name are not credentials."""
        url = f"https://api.example/v1?{name}=visible"
        assert redact_dsn(url) == url
        assert redact_secrets(url) == url

    def test_a_fragment_and_a_userinfo_password_go_too(self) -> None:
        url = "https://reader:pa55@api.example/cb?x=1#access_token=s3cr3t&state=ok"
        shown = "https://reader:***@api.example/cb?x=1#access_token=***&state=ok"
        assert redact_dsn(url) == shown
        assert redact_secrets(url) == shown

    @pytest.mark.parametrize("scheme", ["nats", "tls", "ws", "wss"])
    def test_a_lone_nats_user_is_a_token(self, scheme: str) -> None:
        assert redact_dsn(f"{scheme}://t0ken@host:4222") == f"{scheme}://***@host:4222"
        assert redact_secrets(f"to {scheme}://t0ken@host:4222") == f"to {scheme}://***@host:4222"

    def test_key_value_fields_outside_a_query_are_kept(self) -> None:
        """A log field ``key=5`` is not a query parameter: left alone."""
        text = "late_row table=orders key=5 token_count=3"
        assert redact_secrets(text) == text
