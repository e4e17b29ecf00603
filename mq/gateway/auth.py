"""ACL for 5.x clients: the accounts of the broker's plain_acl.yml, checked as RocketMQ 5's proxy
checks them (ACL 1.0 semantics, Status codes in the answer).

Authentication: the `authorization` header a 5.x client sends with every call (the Telemetry
stream: once, when opened) - "MQv2-HMAC-SHA1 Credential=<accessKey>, SignedHeaders=x-mq-date-time,
Signature=<hex>" - whose signature is the lowercase hex HMAC-SHA1 of the `x-mq-date-time`
header's exact text, keyed by the account's secret key.  No such account, a missing header or a
wrong signature: UNAUTHORIZED.  A peer address in the file's globalWhiteRemoteAddresses, or in
the account's whiteRemoteAddress, skips the check (the 4.x rule).  No clock-skew check (RocketMQ
5 has none either).

Authorization: the resources an RPC touches (a send: PUB on its topic; a receive, ack or change:
SUB on the topic and on the group, as its %RETRY% topic) against the account's permissions, by
the broker's own rule (mq.acl.plain.authorize): FORBIDDEN naming what is missing.

The gateway then calls its broker as the tools account (<rocketmqHome>/conf/tools.yml, as
mqadmin does), else the first admin account of plain_acl.yml: the client was checked here, and
the gateway's own records (POP checkpoints, registrations) belong to no client.  The accounts
file is re-read within RELOAD_S of a change (mq.acl.plain.AclFile's rules)."""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time

from mq.acl.plain import PUB, SUB, AclDenied, AclFile, acl_file_path, authorize
from mq.acl.sign import SessionCredentials, load_tools_yml
from mq.wire.grpc5 import Code
from mq.wire.topics import retry_topic

from .convert import Refused

log = logging.getLogger("mq.gateway")

RELOAD_S = 0.5
AUTH_HEADER = "authorization"
DATE_HEADER = "x-mq-date-time"
ALGORITHM = "MQv2-HMAC-SHA1"


def parse_authorization(text: str) -> tuple[str, str]:
    """(access key, signature hex) of an authorization header; Refused(UNAUTHORIZED) when it is
    not one.  The header: the algorithm, a space, then k=v items separated by commas."""
    algorithm, _, rest = text.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise Refused(Code.UNAUTHORIZED, f"authorization: unknown algorithm {algorithm[:40]!r}")
    items = {}
    for item in rest.split(","):
        k, _, v = item.strip().partition("=")
        items[k.strip()] = v.strip()
    credential, sig = items.get("Credential", ""), items.get("Signature", "")
    user = credential.split("/", 1)[0]
    if not user or not sig:
        raise Refused(Code.UNAUTHORIZED, "authorization: no Credential or no Signature")
    return user, sig


def _peer_ip(context) -> str:
    """The client's address from grpc's peer string ("ipv4:1.2.3.4:5", "ipv6:[::1]:5")."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]").replace("%5B", "").replace("%5D", "")
    return rest.rsplit(":", 1)[0]


class GatewayAuth:
    def __init__(self, rocketmq_home: str):
        self.file = AclFile(acl_file_path(rocketmq_home))
        self.validator = self.file.load()          # AclConfigError: the broker would not start on it either
        self._tools = load_tools_yml(os.path.join(os.path.dirname(self.file.path), "tools.yml"))
        self._polled = time.monotonic()

    def _config(self):
        now = time.monotonic()
        if now - self._polled >= RELOAD_S:
            self._polled = now
            self.file.poll()
        return self.validator.config

    def broker_credentials(self) -> SessionCredentials | None:
        """The account the gateway signs its requests to its broker with (module docstring)."""
        if self._tools is not None:
            return self._tools
        accounts = [a for a in self._config().accounts.values() if a.admin]
        accounts.sort(key=lambda a: bool(a.perms))            # one that may use everything first
        return SessionCredentials(accounts[0].access_key, accounts[0].secret_key) if accounts else None

    def check(self, context, topic: str | None = None, group: str | None = None, publish: bool = False) -> None:
        """Returns when the call's client may do it; Refused UNAUTHORIZED or FORBIDDEN otherwise."""
        cfg = self._config()
        ip = _peer_ip(context)
        if any(w.matches(ip) for w in cfg.global_white):
            return
        meta = dict(context.invocation_metadata() or ())
        header = meta.get(AUTH_HEADER)
        if not header:
            raise Refused(Code.UNAUTHORIZED, "the broker checks ACL and the request has no authorization header")
        user, sig = parse_authorization(header)
        acc = cfg.accounts.get(user)
        if acc is None:
            raise Refused(Code.UNAUTHORIZED, f"no account {user[:64]!r}")
        if acc.white.matches(ip):
            return
        date = meta.get(DATE_HEADER)
        if date is None:
            raise Refused(Code.UNAUTHORIZED, f"authorization without the {DATE_HEADER} header")
        expected = hmac.new(acc.secret_key.encode(), date.encode(), hashlib.sha1).hexdigest()
        if not hmac.compare_digest(expected, sig.lower()):
            raise Refused(Code.UNAUTHORIZED, f"the signature of account {user} does not match")
        need: dict[str, int] = {}
        if topic:
            need[topic] = PUB if publish else SUB
        if group:
            need[retry_topic(group)] = SUB
        try:
            authorize(acc, need)
        except AclDenied as e:
            raise Refused(Code.FORBIDDEN, f"account {user}: {e}") from None

