"""The settings table's TLS rows (docs/TLS.md), with gunicorn's names: the certificate and key,
client certificates, the cipher suites; their parsers, and the checks that need more than one
of them (`check`). table.py puts them after the lobby's other rows.

May import: setting.py and values.py.
"""

from __future__ import annotations

import os

from maitred.config.setting import Setting
from maitred.config.values import PLAIN_PREFIX

CERT_REQS = ("none", "optional", "required")

# The suites rustls offers, by the names rustls gives them (IANA's, TLS 1.3's with TLS13_), and
# OpenSSL's names for them, which gunicorn's --ciphers takes. Every one is in Mozilla's
# "intermediate" configuration.
_SUITES = {
    "TLS13_AES_256_GCM_SHA384": ("TLS_AES_256_GCM_SHA384",),
    "TLS13_AES_128_GCM_SHA256": ("TLS_AES_128_GCM_SHA256",),
    "TLS13_CHACHA20_POLY1305_SHA256": ("TLS_CHACHA20_POLY1305_SHA256",),
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": ("ECDHE-ECDSA-AES256-GCM-SHA384",),
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": ("ECDHE-ECDSA-AES128-GCM-SHA256",),
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": ("ECDHE-ECDSA-CHACHA20-POLY1305",),
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": ("ECDHE-RSA-AES256-GCM-SHA384",),
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": ("ECDHE-RSA-AES128-GCM-SHA256",),
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": ("ECDHE-RSA-CHACHA20-POLY1305",),
}
_SUITE_BY_NAME = {
    alias.upper(): name
    for name, aliases in _SUITES.items()
    for alias in (name, *aliases, name.replace("TLS13_", "TLS_"))
}


def _readable_file(text: str) -> str:
    path = os.path.abspath(text)
    if not os.path.isfile(path):
        raise ValueError(f"{text!r} is not a file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{text!r} is not readable")
    return path


def _cert_reqs(text: str) -> str:
    """none, optional or required; or Python's ssl.CERT_NONE, CERT_OPTIONAL, CERT_REQUIRED
    (0, 1, 2), which a gunicorn config file gives."""
    value = text.strip().lower()
    if value in ("0", "1", "2"):
        return CERT_REQS[int(value)]
    value = value.removeprefix("cert_")
    if value not in CERT_REQS:
        raise ValueError(f"expected none, optional or required (or 0, 1, 2), got {text!r}")
    return value


def _cert_reqs_value(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        # ssl.CERT_REQUIRED and the like are IntEnums: their number, not their name.
        return _cert_reqs(str(int(value)))
    if isinstance(value, str):
        return _cert_reqs(value)
    raise ValueError(f"expected none, optional or required (or 0, 1, 2), got {value!r}")


def _ciphers(text: str) -> list[str]:
    """A colon-separated list of cipher suites, by OpenSSL's or IANA's names: the suites rustls
    is allowed, by rustls's names. OpenSSL's expressions (HIGH, !aNULL, ...) name suites rustls
    does not have, and are refused with the list of those it has."""
    chosen = []
    for entry in (part.strip() for part in text.split(":")):
        if not entry:
            continue
        name = _SUITE_BY_NAME.get(entry.upper())
        if name is None:
            offered = ", ".join(aliases[0] for aliases in _SUITES.values())
            raise ValueError(f"rustls does not support the cipher suite {entry!r}; it supports {offered}")
        if name not in chosen:
            chosen.append(name)
    if not chosen:
        raise ValueError(f"expected cipher suites separated by ':', got {text!r}")
    return chosen


ROWS: tuple[Setting, ...] = (
    Setting(
        "tls",
        "certfile",
        ("--certfile",),
        "FILE",
        _readable_file,
        None,
        "PEM certificate, its chain after it. With --keyfile every listener speaks TLS (HTTPS), but those "
        "written http://ADDRESS; TLS 1.2 and 1.3, ALPN h2 and http/1.1 (--http-protocols). SIGHUP reads it again (docs/TLS.md).",
        default_text="off",
    ),
    Setting(
        "tls",
        "keyfile",
        ("--keyfile",),
        "FILE",
        _readable_file,
        None,
        "PEM private key of --certfile's certificate.",
        default_text="off",
    ),
    Setting(
        "tls",
        "ca_certs",
        ("--ca-certs",),
        "FILE",
        _readable_file,
        None,
        "PEM certificates of the authorities that sign client certificates (with --cert-reqs).",
        default_text="none",
    ),
    Setting(
        "tls",
        "cert_reqs",
        ("--cert-reqs",),
        "MODE",
        _cert_reqs,
        "none",
        "Client certificates: none; optional (asked for, checked against --ca-certs when given); required. "
        "The verified subject is the environ's SSL_CLIENT_S_DN.",
        from_python=_cert_reqs_value,
    ),
    Setting(
        "tls",
        "ciphers",
        ("--ciphers",),
        "LIST",
        _ciphers,
        None,
        "Cipher suites allowed, by OpenSSL's or IANA's names separated by ':'; a suite rustls lacks is refused "
        "by name.",
        default_text="all of rustls's (Mozilla intermediate)",
    ),
)


def check(settings: dict[str, object]) -> None:
    """Raises ValueError, one line, when the TLS settings do not go together."""
    certfile, keyfile = settings["certfile"], settings["keyfile"]
    if (certfile is None) != (keyfile is None):
        given, missing = ("--certfile", "--keyfile") if keyfile is None else ("--keyfile", "--certfile")
        raise ValueError(f"{given} is given without {missing}: TLS needs both")
    if certfile is None:
        for name, flag in (("ca_certs", "--ca-certs"), ("ciphers", "--ciphers")):
            if settings[name] is not None:
                raise ValueError(f"{flag} is given without --certfile and --keyfile: no listener speaks TLS")
        if settings["cert_reqs"] != "none":
            raise ValueError("--cert-reqs is given without --certfile and --keyfile: no listener speaks TLS")
        return
    if settings["cert_reqs"] != "none" and settings["ca_certs"] is None:
        raise ValueError(f"--cert-reqs {settings['cert_reqs']} needs --ca-certs, to verify client certificates")
    if settings["proxy_protocol"] != "off" and any(
        not str(bind).startswith(PLAIN_PREFIX)
        for bind in settings["bind"]  # type: ignore[attr-defined]
    ):
        raise ValueError(
            "--proxy-protocol with TLS listeners is not supported: its header would come before the TLS "
            "handshake; give the proxy a plain listener (http://ADDRESS)"
        )


def plain_binds(binds: list[str]) -> list[str]:
    """The listeners that speak plain HTTP beside TLS ones, for the lobby."""
    return [bind for bind in binds if bind.startswith(PLAIN_PREFIX)]
