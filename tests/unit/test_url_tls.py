"""``tandems://`` URLs: the scheme, the ``ca`` option, and URLs made back from them."""

from __future__ import annotations

import pytest

from client.errors import TandemError
from client.url import format_url, parse_url


def test_tandems_urls_parse() -> None:
    p = parse_url("tandems://u:pw@h1:1,h2:2/?ca=/etc/tandem/ca.crt&name=x")
    assert p.tls and p.ca == "/etc/tandem/ca.crt" and p.hosts == (("h1", 1), ("h2", 2))
    assert format_url(p, "h3:3") == "tandems://u:pw@h3:3/?ca=/etc/tandem/ca.crt"
    assert not parse_url("tandem://u:pw@h1:1").tls
    with pytest.raises(TandemError, match="only with tandems://"):
        parse_url("tandem://u:pw@h1:1/?ca=/x.pem")
    with pytest.raises(TandemError, match="TLS CA file /nonexistent/ca.pem: no such file"):
        parse_url("tandems://u:pw@h1:1/?ca=/nonexistent/ca.pem").context()
