"""RocketMQ's plain ACL: the accounts file and the verdict on one request.

Facts from RocketMQ 4.9 (acl/plain/PlainAccessValidator.java, PlainPermissionManager.java,
RemoteAddressStrategyFactory.java, acl/common/Permission.java):

The file, `$ROCKETMQ_HOME/conf/plain_acl.yml` (YAML):
    globalWhiteRemoteAddresses: [pattern, ...]    # any request from these is allowed
    accounts:
      - accessKey: RocketMQ                        # longer than 6 characters
        secretKey: 12345678                        # longer than 6 characters
        whiteRemoteAddress: 192.168.0.*            # requests of this account from here skip
                                                   # the signature and permission checks
        admin: false                               # may it run the admin codes (below)?
        defaultTopicPerm: DENY                     # for topics not listed; missing = DENY
        defaultGroupPerm: SUB                      # for groups not listed; missing = DENY
        topicPerms: [topicA=DENY, topicB=PUB|SUB, topicC=SUB]
        groupPerms: [groupA=DENY, groupB=PUB|SUB]  # a group is checked as its %RETRY% topic
Permissions: DENY, PUB, SUB, PUB|SUB (or SUB|PUB); anything else reads as DENY in a default
and is refused in a topicPerms/groupPerms entry.

Address patterns: blank (matches nothing), `*` / `*.*.*.*` / `*:*:*:*:*:*:*:*` (everything),
`a,b,c` or `192.168.1.{1,2}` (a list), `192.168.1.*`, `192.168.*` and `192.168.1.10-20`
(the first `*` or `a-b` octet is a range; later octets are not looked at, as in RocketMQ), or
one exact address.  IPv6 addresses are matched exactly or by `*`; RocketMQ's IPv6 ranges are
refused at load (named limit: this broker listens on IPv4).

The verdict (`Validator.check`), in RocketMQ's order:
  1. the peer matches a global white address -> allowed;
  2. no AccessKey -> "No accessKey is configured"; unknown -> "No acl config for <key>";
  3. the peer matches the account's whiteRemoteAddress -> allowed;
  4. the Signature differs from the one computed with the account's secret -> "Check signature
     failed for accessKey=<key>";
  5. a send that only publishes to RMQ_SYS_TRACE_TOPIC -> allowed (message trace);
  6. an admin code (UPDATE_AND_CREATE_TOPIC 17, UPDATE_BROKER_CONFIG 25, DELETE_TOPIC_IN_BROKER
     215, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP 200, DELETE_SUBSCRIPTIONGROUP 207, and - ours - the
     ACL codes 50, 51, 53) from a non-admin -> "Need admin permission for request code=<code>,
     but accessKey=<key> is not";
  7. every resource the request needs (table RESOURCES below) checked against the account's
     listed permission, else its default -> "No default permission for topic:<t>" (or group:<g>).
     An admin account with no topicPerms and no groupPerms skips this step.
A refused request is answered SYSTEM_ERROR (1) with the reason in the remark, as RocketMQ 4.9's
remoting layer answers the AclException its RPC hook throws; it never reaches a handler, so
nothing is stored."""
from __future__ import annotations

import ipaddress
import json
import logging
import os
from dataclasses import dataclass, field

from mq.wire.codes import RequestCode as R
from mq.wire.headers import send_long_names
from mq.wire.topics import RETRY_PREFIX, TRACE_TOPIC, retry_topic

from .sign import ACCESS_KEY, SIGNATURE, UNIQUE_KEY_QUERY, signature, signed_content

log = logging.getLogger("mq.acl")

FILE_NAME = os.path.join("conf", "plain_acl.yml")
FILE_SIZE_MAX = 4 * 1024 * 1024          # bytes; a bigger accounts file is refused (named limit)
KEY_LENGTH_MIN_EXCLUSIVE = 6             # RocketMQ: access and secret keys longer than 6 characters

DENY, ANY, PUB, SUB = 1, 2, 4, 8         # Permission.java's bits
ADMIN_CODES = frozenset({R.UPDATE_AND_CREATE_TOPIC, R.UPDATE_BROKER_CONFIG, R.DELETE_TOPIC_IN_BROKER,
                         R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, R.DELETE_SUBSCRIPTIONGROUP,
                         # beyond RocketMQ 4.9, which lets any account edit the accounts:
                         R.UPDATE_AND_CREATE_ACL_CONFIG, R.DELETE_ACL_CONFIG, R.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG})
_PERM_NAMES = {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": DENY}


class AclConfigError(ValueError):
    """The accounts file cannot be used (not YAML, a wrong layout, a bad pattern or key)."""


class AclDenied(Exception):
    """A request refused; str() is the reason (RocketMQ's AclException message)."""


def acl_file_path(rocketmq_home: str = "") -> str:
    """Where the broker reads its accounts: `<home>/conf/plain_acl.yml`, home being the
    broker's rocketmqHome key, else $ROCKETMQ_HOME, else the working directory."""
    home = rocketmq_home or os.environ.get("ROCKETMQ_HOME") or os.getcwd()
    return os.path.join(home, FILE_NAME)


def parse_perm(text) -> int:
    """A default permission: anything unknown (or missing) is DENY, as Permission.parsePermFromString."""
    return _PERM_NAMES.get(str(text).strip(), DENY) if text is not None else DENY


def check_permission(needed: int, owned: int) -> bool:
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


# ---- remote address patterns ------------------------------------------------------------------

class AddressPattern:
    """One whiteRemoteAddress pattern, compiled; `matches(ip)` with the peer's address text."""

    def __init__(self, text):
        self.text = "" if text is None else str(text).strip()
        self.any = False
        self.exact: frozenset[str] = frozenset()
        self.head: str | None = None       # range: the octets before the ranged one, with the dot
        self.index = 0                     # range: which octet (1..3) holds the range
        self.low = self.high = 0
        t = self.text
        if not t:
            return                                               # blank: matches nothing
        if t in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
            self.any = True
        elif t.endswith("}"):
            head, brace, tail = t.rpartition("{")
            if not brace or ":" in t or len(t.split(".")) < 4:
                raise AclConfigError(f"address pattern {t!r}: expected like 192.168.1.{{1,2,3}}")
            self.exact = frozenset(_ipv4(head + part.strip(), t) for part in tail[:-1].split(",") if part.strip())
        elif "," in t:
            self.exact = frozenset(_exact(part.strip(), t) for part in t.split(",") if part.strip())
        elif "*" in t or "-" in t:
            self._range(t)
        else:
            self.exact = frozenset({_exact(t, t)})

    def _range(self, t: str) -> None:
        if ":" in t:
            raise AclConfigError(f"address pattern {t!r}: IPv6 ranges are not supported (exact IPv6 or * only)")
        parts = [p.strip() for p in t.split(".")]
        if len(parts) != 4:
            raise AclConfigError(f"address pattern {t!r}: an IPv4 range has 4 parts, like 192.168.1.*")
        for i in (1, 2, 3):
            v = parts[i]
            if v == "*":
                low, high = 0, 255
            elif "-" in v:
                a, _, b = v.partition("-")
                if not (a.isdigit() and b.isdigit()) or not 0 <= int(a) <= int(b) <= 255:
                    raise AclConfigError(f"address pattern {t!r}: range {v!r} is not a-b with 0 <= a <= b <= 255")
                low, high = int(a), int(b)
            else:
                continue
            if not all(p.isdigit() and 0 <= int(p) <= 255 for p in parts[:i]):
                raise AclConfigError(f"address pattern {t!r}: the octets before the range must be 0..255")
            self.head, self.index, self.low, self.high = ".".join(parts[:i]) + ".", i, low, high
            return
        raise AclConfigError(f"address pattern {t!r}: a range is * or a-b in the second, third or fourth octet")

    def matches(self, ip: str) -> bool:
        if self.any:
            return True
        if self.head is not None:
            if not ip.startswith(self.head):
                return False
            octets = ip.split(".")
            return len(octets) == 4 and octets[self.index].isdigit() and \
                self.low <= int(octets[self.index]) <= self.high
        return ip in self.exact


def _ipv4(text: str, pattern: str) -> str:
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        raise AclConfigError(f"address pattern {pattern!r}: {text!r} is not an IPv4 address") from None


def _exact(text: str, pattern: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise AclConfigError(f"address pattern {pattern!r}: {text!r} is not an IP address") from None


# ---- the accounts file -----------------------------------------------------------------------

@dataclass
class Account:
    access_key: str
    secret_key: str
    white: AddressPattern
    admin: bool
    default_topic_perm: int
    default_group_perm: int
    perms: dict[str, int] = field(default_factory=dict)    # topic or %RETRY%group -> bits


@dataclass
class AclConfig:
    global_white: list[AddressPattern]
    accounts: dict[str, Account]

    @classmethod
    def parse(cls, text: str, where: str = "plain_acl.yml") -> "AclConfig":
        """The file's text -> AclConfig; AclConfigError saying what is wrong and where."""
        import yaml
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise AclConfigError(f"{where}: not YAML: {e}") from None
        if data is None:
            # RocketMQ 4.9 refuses it too ("file is not data"); what an editor shows for a moment
            # between truncating the file and writing it must not take every account away
            raise AclConfigError(f"{where}: no accounts data (the file is empty or only comments)")
        if not isinstance(data, dict):
            raise AclConfigError(f"{where}: the top level is a {type(data).__name__}, not a mapping")
        white = [AddressPattern(p) for p in _list(data, "globalWhiteRemoteAddresses", where)]
        accounts: dict[str, Account] = {}
        for n, raw in enumerate(_list(data, "accounts", where)):
            if not isinstance(raw, dict):
                raise AclConfigError(f"{where}: accounts[{n}] is not a mapping")
            acc = _account(raw, f"{where}: accounts[{n}]")
            if acc.access_key in accounts:
                raise AclConfigError(f"{where}: accounts[{n}]: accessKey {acc.access_key!r} appears twice")
            accounts[acc.access_key] = acc
        return cls(white, accounts)


def _list(data: dict, key: str, where: str) -> list:
    v = data.get(key)
    if v is None:
        return []
    if not isinstance(v, list):
        raise AclConfigError(f"{where}: {key} is not a list")
    return v


def _text(v) -> str | None:
    """A YAML scalar as the Java loader's String field sees it (12345678 is a key, not a number)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _account(raw: dict, where: str) -> Account:
    ak, sk = _text(raw.get("accessKey")), _text(raw.get("secretKey"))
    if ak is None or sk is None or len(ak) <= KEY_LENGTH_MIN_EXCLUSIVE or len(sk) <= KEY_LENGTH_MIN_EXCLUSIVE:
        raise AclConfigError(f"{where}: accessKey and secretKey must be longer than "
                             f"{KEY_LENGTH_MIN_EXCLUSIVE} characters (accessKey={ak!r})")
    try:
        white = AddressPattern(raw.get("whiteRemoteAddress"))
    except AclConfigError as e:
        raise AclConfigError(f"{where}: {e}") from None
    admin = raw.get("admin", False)
    if not isinstance(admin, bool):
        admin = _text(admin).strip().lower() == "true"
    perms: dict[str, int] = {}
    for key, is_topic in (("groupPerms", False), ("topicPerms", True)):
        for item in _list(raw, key, where):
            name, eq, perm = str(item).partition("=")
            perm = perm.strip()
            if not eq or not name.strip() or "=" in perm:
                raise AclConfigError(f"{where}: {key} entry {item!r} is not Resource=Perm (like topicA=SUB)")
            if perm not in _PERM_NAMES:
                raise AclConfigError(f"{where}: {key} entry {item!r}: the permission is DENY, PUB, SUB or PUB|SUB")
            perms[name.strip() if is_topic else retry_topic(name.strip())] = _PERM_NAMES[perm]
    return Account(ak, sk, white, admin, parse_perm(raw.get("defaultTopicPerm")),
                   parse_perm(raw.get("defaultGroupPerm")), perms)


# ---- one request -------------------------------------------------------------------------------

def _field(ext: dict, name: str, code: int) -> str:
    v = ext.get(name)
    if v is None:
        raise AclDenied(f"request code={code} lacks the field {name}")
    return v


def needed_resources(cmd) -> dict[str, int]:
    """What the request touches and how (PlainAccessValidator.parse): resource -> PUB or SUB; a
    group appears as its %RETRY% topic.  A field the table needs and the request lacks, or a
    heartbeat body that is not JSON, refuses the request (RocketMQ wraps that into its
    AclException too)."""
    ext, code = cmd.ext_fields, cmd.code
    need: dict[str, int] = {}
    if code == R.SEND_MESSAGE or code == R.SEND_MESSAGE_V2 or code == R.SEND_BATCH_MESSAGE:
        # read as the send path reads it (letters or long names, by the same test), so the
        # topic checked is the topic stored to, whichever code and form the header uses
        h = send_long_names(ext)
        topic = h.get("topic")
        if topic is not None and topic.startswith(RETRY_PREFIX):
            group = h.get("producerGroup")
            if group is not None:
                need[retry_topic(group)] = SUB
        elif topic is not None:
            need[topic] = PUB
    elif code == R.CONSUMER_SEND_MSG_BACK:
        need[retry_topic(_field(ext, "group", code))] = SUB
    elif code == R.PULL_MESSAGE:
        need[_field(ext, "topic", code)] = SUB
        need[retry_topic(_field(ext, "consumerGroup", code))] = SUB
    elif code == R.QUERY_MESSAGE:
        need[_field(ext, "topic", code)] = SUB
    elif code == R.HEART_BEAT:
        try:
            body = json.loads(bytes(cmd.body).decode("utf-8")) if cmd.body else {}
            for cd in body.get("consumerDataSet") or []:
                need[retry_topic(cd["groupName"])] = SUB
                for sd in cd.get("subscriptionDataSet") or []:
                    need[sd["topic"]] = SUB
        except (ValueError, UnicodeDecodeError, AttributeError, KeyError, TypeError) as e:
            raise AclDenied(f"heartbeat body cannot be read: {type(e).__name__}: {e}") from None
    elif code == R.UNREGISTER_CLIENT:
        group = ext.get("consumerGroup")
        if group:
            need[retry_topic(group)] = SUB
    elif code == R.GET_CONSUMER_LIST_BY_GROUP:
        need[retry_topic(_field(ext, "consumerGroup", code))] = SUB
    elif code == R.UPDATE_CONSUMER_OFFSET:
        need[retry_topic(_field(ext, "consumerGroup", code))] = SUB
        need[_field(ext, "topic", code)] = SUB
    return need


def _printable(resource: str) -> str:
    if resource.startswith(RETRY_PREFIX):
        return "group:" + resource[len(RETRY_PREFIX):]
    return "topic:" + resource


class Validator:
    """The verdict on requests against one AclConfig (swap `config` to reload)."""

    def __init__(self, config: AclConfig):
        self.config = config

    def check(self, cmd, peer_ip: str) -> None:
        """Returns when `cmd` from `peer_ip` is allowed; raises AclDenied with the reason."""
        cfg = self.config
        for w in cfg.global_white:
            if w.matches(peer_ip):
                return
        ext = cmd.ext_fields
        if ext is None:
            raise AclDenied("No accessKey is configured")
        need = needed_resources(cmd)
        key = ext.get(ACCESS_KEY)
        if key is None:
            raise AclDenied("No accessKey is configured")
        acc = cfg.accounts.get(key)
        if acc is None:
            raise AclDenied(f"No acl config for {key}")
        if acc.white.matches(peer_ip):
            return
        expected = signature(signed_content(ext, cmd.body, skip=(SIGNATURE, UNIQUE_KEY_QUERY)), acc.secret_key)
        if ext.get(SIGNATURE) != expected:
            raise AclDenied(f"Check signature failed for accessKey={key}")
        if need.get(TRACE_TOPIC) == PUB:
            return
        if cmd.code in ADMIN_CODES and not acc.admin:
            raise AclDenied(f"Need admin permission for request code={cmd.code}, but accessKey={key} is not")
        authorize(acc, need)


def authorize(acc: Account, need: dict[str, int]) -> None:
    """Returns when account `acc` holds every permission of `need` (resource -> PUB or SUB; a
    group as its %RETRY% topic); raises AclDenied naming the first it lacks.  An admin with no
    topic or group permissions listed may use everything."""
    if not need or (acc.admin and not acc.perms):
        return
    for resource, needed in need.items():
        owned = acc.perms.get(resource)
        if owned is None:
            owned = acc.default_group_perm if resource.startswith(RETRY_PREFIX) else acc.default_topic_perm
        if not check_permission(needed, owned):
            raise AclDenied(f"No default permission for {_printable(resource)}")


class AclFile:
    """The accounts file at `path`, reloaded when it changes.  load() at start raises
    AclConfigError (a broker does not start on a file it cannot use); poll() afterwards
    reloads after a change of its size, mtime or inode and keeps the last good accounts
    when the new text is unusable (logged once per change)."""

    def __init__(self, path: str):
        self.path = path
        self.validator: Validator | None = None
        self._stamp: tuple | None = None

    def _read(self) -> tuple[tuple, str]:
        st = os.stat(self.path)
        if st.st_size > FILE_SIZE_MAX:
            raise AclConfigError(f"{self.path}: {st.st_size} bytes, over the {FILE_SIZE_MAX}-byte limit")
        with open(self.path, encoding="utf-8") as f:
            text = f.read(FILE_SIZE_MAX + 1)
        return (st.st_size, st.st_mtime_ns, st.st_ino), text

    def load(self) -> Validator:
        try:
            stamp, text = self._read()
        except FileNotFoundError:
            raise AclConfigError(f"aclEnable=true but {self.path} does not exist") from None
        except (OSError, UnicodeDecodeError) as e:
            raise AclConfigError(f"{self.path}: {e}") from None
        self.validator = Validator(AclConfig.parse(text, self.path))
        self._stamp = stamp
        return self.validator

    def _stat(self) -> tuple:
        try:
            st = os.stat(self.path)
            return st.st_size, st.st_mtime_ns, st.st_ino
        except OSError as e:
            return "missing", str(e)

    def poll(self) -> bool:
        """True when the accounts were reloaded.  Text that changed while it was read (an editor
        writing in place) is not judged: the next poll reads it again."""
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            _, text = self._read()
            if self._stat() != stamp:
                self._stamp = None
                return False
            config = AclConfig.parse(text, self.path)
        except (OSError, UnicodeDecodeError, AclConfigError) as e:
            log.error("ACL: %s; the previous accounts stay in force", e)
            return False
        self.validator.config = config
        log.info("ACL: reloaded %s (%d accounts, %d global white patterns)", self.path,
                 len(config.accounts), len(config.global_white))
        return True


# ---- changing the file (RocketMQ's ACL admin codes 50, 51, 53) --------------------------------

ACCOUNT_KEYS = ("accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm", "defaultGroupPerm",
                "topicPerms", "groupPerms")


def _edit(path: str, change) -> None:
    """Read-modify-write of the accounts file under an flock on `<path>.lock` (io workers of one
    broker may run edits at once): change(data) edits the parsed YAML mapping in place; the
    result must parse as an AclConfig (AclConfigError otherwise, the file untouched); it is
    written to a temporary file and renamed over the old one, so a reader sees one or the other.
    Comments are not kept (RocketMQ's writer drops them too)."""
    import fcntl
    import yaml
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f.read(FILE_SIZE_MAX + 1)) or {}
        except FileNotFoundError:
            data = {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise AclConfigError(f"{path}: {e}") from None
        if not isinstance(data, dict):
            raise AclConfigError(f"{path}: the top level is not a mapping")
        change(data)
        text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
        AclConfig.parse(text, path)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def update_account(path: str, fields: dict) -> None:
    """UPDATE_AND_CREATE_ACL_CONFIG: creates the account `fields["accessKey"]`, or changes the
    fields given of an existing one (as PlainPermissionManager.updateAccessConfig).  topicPerms
    and groupPerms are comma-separated lists, as on the wire."""
    ak = fields.get("accessKey")
    if not ak:
        raise AclConfigError("accessKey is required")

    def change(data):
        accounts = data.get("accounts")
        if accounts is None:
            accounts = data["accounts"] = []
        if not isinstance(accounts, list):
            raise AclConfigError("accounts is not a list")
        acc = next((a for a in accounts if isinstance(a, dict) and _text(a.get("accessKey")) == ak), None)
        if acc is None:
            acc = {"accessKey": ak}
            accounts.append(acc)
        for key in ACCOUNT_KEYS[1:]:
            v = fields.get(key)
            if v is None:
                continue
            if key in ("topicPerms", "groupPerms"):
                v = [p.strip() for p in str(v).split(",") if p.strip()]
            elif key == "admin":
                v = v is True or str(v).strip().lower() == "true"
            acc[key] = v
    _edit(path, change)


def delete_account(path: str, access_key: str) -> None:
    """DELETE_ACL_CONFIG: removes the account; AclConfigError when there is none."""
    def change(data):
        accounts = data.get("accounts") or []
        keep = [a for a in accounts if not (isinstance(a, dict) and _text(a.get("accessKey")) == access_key)]
        if len(keep) == len(accounts):
            raise AclConfigError(f"no account with accessKey {access_key}")
        data["accounts"] = keep
    _edit(path, change)


def update_global_white(path: str, addrs: str) -> None:
    """UPDATE_GLOBAL_WHITE_ADDRS_CONFIG: the global white addresses become the comma-separated
    list `addrs` (empty: none)."""
    def change(data):
        data["globalWhiteRemoteAddresses"] = [a.strip() for a in addrs.split(",") if a.strip()]
    _edit(path, change)
