"""What a DLedger member tells about itself in GET_BROKER_RUNTIME_INFO (28), for `mqadmin
clusterList` and `brokerStatus`: its Raft role and term, the leader, its committed and last
index, and -- on the leader -- every follower's match index and lag (entries behind).  Read from
the DLedger role's status file (mq.dledger.role, rewritten on every change and every second)
and from the control block."""
from __future__ import annotations

from mq.dledger.role import read_status
from mq.store import control as C


def dledger_runtime_info(store_root: str, ctl) -> dict[str, str]:
    st = read_status(store_root) or {}
    last = ctl.get(C.POS_DL_NEXT_INDEX) - 1
    info = {
        "dLegerRole": str(st.get("role", "UNKNOWN")), "dLegerTerm": str(st.get("term", "")),
        "dLegerLeaderId": str(st.get("leader") or ""), "dLegerSelfId": str(st.get("selfId", "")),
        "dLegerGroup": str(st.get("group", "")), "dLegerPeers": ";".join(f"{p}-{a}" for p, a in
                                                                        (st.get("peersAddr") or {}).items()),
        "dLegerCommitIndex": str(ctl.get(C.POS_DL_COMMIT_INDEX) - 1), "dLegerLastIndex": str(last),
        "dLegerReady": "true" if ctl.get(C.POS_DL_APPEND_TERM) else "false",
    }
    peers = st.get("peers") or {}
    if peers:
        info["dLegerFollowers"] = ";".join(f"{p}:match={v.get('match')}:lag={max(0, last - int(v.get('match', -1)))}"
                                           for p, v in sorted(peers.items()))
    return info
