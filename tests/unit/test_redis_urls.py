"""``RedisSentinelCache``'s ``redis+sentinel://`` URL (django_leader.backends.redis.sentinel)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_leader.backends.redis.sentinel import parse


def test_a_url_names_the_sentinels_the_service_and_the_database() -> None:
    found = parse("redis+sentinel://user:s%40cret@s-1:26379,[::1]:26380/mymaster/3")
    assert found == {
        "sentinels": [("s-1", 26379), ("::1", 26380)],
        "service": "mymaster",
        "db": 3,
        "username": "user",
        "password": "s@cret",
        "ssl": False,
    }
    plain = parse("rediss+sentinel://s-1:26379/leases")
    assert (plain["db"], plain["password"], plain["ssl"]) == (0, None, True)


@pytest.mark.parametrize(
    "url",
    [
        "redis://s-1:26379/mymaster",  # not a Sentinel URL
        "redis+sentinel://:hunter2@s-1:26379",  # no service
        "redis+sentinel://:hunter2@s-1/mymaster",  # no port
        "redis+sentinel://:hunter2@s-1:26379/mymaster/zero",  # a database that is no number
        "redis+sentinel://:hunter2@s-1:26379/a/0/extra",
    ],
)
def test_a_malformed_url_is_refused_without_its_password(url: str) -> None:
    with pytest.raises(ImproperlyConfigured) as refused:
        parse(url)
    assert "hunter2" not in str(refused.value)
