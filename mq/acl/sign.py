"""Request signatures, as RocketMQ's `AclClientRPCHook` makes them and `PlainAccessValidator`
checks them (acl/common/AclUtils.java, AclSigner.java in RocketMQ 4.9).

The signed content is the values of every extField except `Signature` (and the broker also
leaves out `_UNIQUE_KEY_QUERY`), in the order of their keys, concatenated and UTF-8 encoded,
followed by the request body as sent.  The signature is Base64(HMAC-SHA1(content, secretKey)),
carried in the extField `Signature`, next to `AccessKey`.

Key order: Java sorts keys as UTF-16 code units, Python as code points; the two agree unless a
key holds characters beyond the Basic Multilingual Plane next to ones from U+E000..U+FFFF,
which no RocketMQ header field name does."""
from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"                  # only in tools.yml, never on the wire
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"    # MixAll.UNIQUE_MSG_QUERY_FLAG: the broker leaves it out


@dataclass(frozen=True)
class SessionCredentials:
    """An account's keys, as a client holds them.  repr never shows the secret."""
    access_key: str
    secret_key: str
    security_token: str | None = None

    def __repr__(self) -> str:
        return f"SessionCredentials(access_key={self.access_key!r}, secret_key=***)"


def signed_content(ext: dict, body: bytes | memoryview | None, *, skip=(SIGNATURE,)) -> bytes:
    """What the signature covers: the extField values sorted by key (keys in `skip` left out),
    then the body.  Values must already be text (as decoded headers hold them)."""
    data = "".join([v for k, v in sorted(ext.items()) if k not in skip]).encode("utf-8")
    return data + body if body else data


def signature(content: bytes, secret_key: str | bytes) -> str:
    """Base64 of HMAC-SHA1(content) keyed by the UTF-8 secret key."""
    key = secret_key.encode("utf-8") if secret_key.__class__ is str else secret_key
    return base64.b64encode(hmac.digest(key, content, hashlib.sha1)).decode("ascii")


def sign_request(cmd, credentials: SessionCredentials) -> None:
    """Adds AccessKey (and SecurityToken when the credentials have one) and the Signature over
    the final extFields and body to `cmd`, as the Java client's RPC hook does just before a
    request is written.  Call it last: a field changed afterwards breaks the signature."""
    ext = cmd.ext_fields if cmd.ext_fields is not None else {}
    ext.pop(SIGNATURE, None)
    ext[ACCESS_KEY] = credentials.access_key
    if credentials.security_token:
        ext[SECURITY_TOKEN] = credentials.security_token
    ext[SIGNATURE] = signature(signed_content(ext, cmd.body), credentials.secret_key)
    cmd.ext_fields = ext


def load_tools_yml(path: str) -> SessionCredentials | None:
    """The admin tool's account, from RocketMQ's `conf/tools.yml` (keys accessKey, secretKey);
    None when the file is missing or either key is blank (then requests go unsigned, as
    RocketMQ's mqadmin does).  A file that is not YAML raises ValueError."""
    import yaml
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        return None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not YAML: {e}") from None
    if not isinstance(data, dict):
        return None
    ak, sk = data.get("accessKey"), data.get("secretKey")
    if ak is None or sk is None or not str(ak).strip() or not str(sk).strip():
        return None
    return SessionCredentials(str(ak), str(sk))
