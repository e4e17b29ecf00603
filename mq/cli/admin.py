"""mqadmin: RocketMQ's operator tool, the subcommands an operator reaches for first.

    mqadmin clusterList      -n NS
    mqadmin topicList        -n NS [-c]                     (-c: with clusters and consumer groups)
    mqadmin topicRoute       -n NS -t TOPIC;  topicClusterList -n NS -t TOPIC
    mqadmin topicStatus      -n NS -t TOPIC
    mqadmin updateTopic      -n NS (-c CLUSTER | -b BROKER_ADDR) -t TOPIC [-r 8] [-w 8] [-p 6] [-o false]
                             [-a +message.type=FIFO]
    mqadmin updateTopicPerm  -n NS (-c CLUSTER | -b BROKER_ADDR) -t TOPIC -p PERM
    mqadmin updateOrderConf  -n NS -t TOPIC -m (get | put -v BROKER:NUM;... | delete)
    mqadmin deleteTopic      -n NS -c CLUSTER -t TOPIC
    mqadmin consumerProgress -n NS [-g GROUP [-t TOPIC]]    (no -g: every group, one line each)
    mqadmin consumerStatus   -n NS -g GROUP [-i CLIENT_ID] [-b BROKER_ADDR]
    mqadmin cloneGroupOffset -n NS -s SRC_GROUP -d DEST_GROUP [-t TOPIC] [-o true]
    mqadmin queryCq          -n NS -t TOPIC -q QUEUE_ID -i INDEX [-c 10] [-b BROKER_ADDR] [-g GROUP]
    mqadmin getNamesrvConfig -n NS;  updateNamesrvConfig -n NS -k KEY -v VALUE
    mqadmin updateKvConfig   -n NS -s NAMESPACE -k KEY -v VALUE;  deleteKvConfig -n NS -s NAMESPACE -k KEY
    mqadmin sendMsgStatus    -n NS -b BROKER_NAME [-s 128] [-c 50]
    mqadmin brokerStatus     -n NS (-b BROKER_ADDR | -c CLUSTER)
    mqadmin getBrokerConfig  -n NS (-b BROKER_ADDR | -c CLUSTER)
    mqadmin queryMsgByOffset -n NS -t TOPIC -b BROKER_NAME -i QUEUE_ID -o QUEUE_OFFSET
    mqadmin queryMsgById     -n NS -i MSGID[,MSGID] [-t TOPIC]      (and who consumed it)
    mqadmin queryMsgByUniqueKey -n NS -i UNIQ_KEY -t TOPIC [-a]
    mqadmin queryMsgByKey    -n NS -t TOPIC -k KEY [-b BEGIN] [-e END] [-c MAX]
    mqadmin printMsg         -n NS -t TOPIC [-s TAGS] [-b BEGIN] [-e END] [-d true|false] [-c CHARSET]
    mqadmin leadershipTransfer -n NS -b BROKER_NAME -t TRANSFEREE_ID [-w 10]   (DLedger mode)
    mqadmin updateSubGroup   -n NS (-b ADDR | -c CLUSTER) -g GROUP [-s -m -d -q -r -i -w -a -o]
    mqadmin deleteSubGroup   -n NS (-b ADDR | -c CLUSTER) -g GROUP [-r true]
    mqadmin resetOffsetByTime -n NS -g GROUP -t TOPIC -s (now | MS | yyyy-MM-dd#HH:mm:ss:SSS) [-f false]
    mqadmin wipeWritePerm / addWritePerm -n NS -b BROKER_NAME
    mqadmin updateBrokerConfig -n NS (-b ADDR | -c CLUSTER) -k KEY -v VALUE
    mqadmin producerConnection -n NS -g GROUP -t TOPIC;  consumerConnection -n NS -g GROUP [-b ADDR]
    mqadmin brokerConsumeStats -n NS -b ADDR [-l DIFF_LEVEL];  statsAll -n NS [-t TOPIC] [-a]
    mqadmin sendMessage      -n NS -t TOPIC -p BODY [-k KEYS] [-c TAGS] [-b BROKER_NAME -i QID]
    mqadmin consumeMessage   -n NS -t TOPIC [-b BROKER_NAME] [-i QID] [-o OFFSET] [-s BEGIN] [-e END] [-c N]
    mqadmin clusterRT        -n NS [-a AMOUNT] [-s SIZE] [-c CLUSTER] [-i SECONDS]
    mqadmin updateAclConfig  -n NS (-b BROKER_ADDR | -c CLUSTER) -a KEY [-s SECRET] [-w ADDR] [-i PERM] [-u PERM]
                             [-t topicA=PUB,...] [-g groupA=SUB,...] [-m true|false]
    mqadmin deleteAclConfig  -n NS (-b BROKER_ADDR | -c CLUSTER) -a KEY
    mqadmin updateGlobalWhiteAddr -n NS (-b BROKER_ADDR | -c CLUSTER) -g PATTERN,PATTERN

Flags and output tables follow RocketMQ 4.9.8's tools (T/command/...); -n may be left out when
$NAMESRV_ADDR is set, and several name servers are separated by ';'.  Long flag names (--namesrvAddr,
--topic, --clusterName, --brokerAddr, ...) work too.

On a broker with aclEnable=true, requests are signed with the account in
$ROCKETMQ_HOME/conf/tools.yml (accessKey, secretKey; the working directory when ROCKETMQ_HOME is unset).

Exit codes: 0 success (also when stdout's reader leaves early, as in `mqadmin ... | head`); 1 the
operation failed (unreachable server, error answer, no such topic/cluster/message), with one line on
stderr and no traceback; 2 bad command line (usage on stderr)."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from datetime import datetime

from mq import loop as mq_loop
from mq.client import AdminClient, MQClientError, RemotingError, TopicConfig
from mq.wire.codes import RequestCode as R
from mq.wire.errors import MalformedError
from mq.wire.topics import apply_attributes

PROG = "mqadmin"
COMMAND_TIMEOUT_S = 60.0


class UsageError(Exception):
    pass


# --------------------------------------------------------------------------------------------------
# Commands.  Each is async (admin, args) -> exit code and prints to stdout.

async def cluster_list(admin: AdminClient, args) -> int:
    info = await admin.cluster_info()
    # RocketMQ's columns, then ours: role, CommitLog max offset, and on a master each
    # slave's acknowledged offset and lag in bytes; in DLedger mode each member's Raft role,
    # term, committed and last index, and on the leader each follower's lag in entries
    fmt = "%-22s  %-22s  %-4s  %-22s %-16s %19s %19s %10s %5s %6s  %-12s %14s  %s"
    print(fmt % ("#Cluster Name", "#Broker Name", "#BID", "#Addr", "#Version", "#InTPS(LOAD)", "#OutTPS(LOAD)",
                 "#PCWait(ms)", "#Hour", "#SPACE", "#Role", "#MaxOffset", "#Replication"))
    for cluster in sorted(info.cluster_addr_table):
        for name in info.cluster_addr_table[cluster]:
            b = info.broker_addr_table.get(name)
            if b is None:
                continue
            for bid, addr in sorted(b.broker_addrs.items()):
                try:
                    t = await admin.broker_runtime_info(addr)
                except (MQClientError, RemotingError) as e:
                    print(fmt % (cluster, name, bid, addr, "N/A", "N/A", "N/A", "N/A", "N/A", "N/A", "N/A", "N/A",
                                 "N/A"))
                    print(f"{PROG}: warning: {addr}: {e}", file=sys.stderr)
                    continue
                in_tps = _first_float(t.get("putTps"))
                out_tps = _first_float(t.get("getTransferedTps"))
                earliest = _int(t.get("earliestMessageTimeStamp"))
                hours = (time.time() * 1000 - earliest) / 3_600_000 if earliest > 0 else 0.0
                print(fmt % (cluster, name, bid, addr, t.get("brokerVersionDesc", ""),
                             "%9.2f(%s,%sms)" % (in_tps, t.get("sendThreadPoolQueueSize", "0"),
                                                 t.get("sendThreadPoolQueueHeadWaitTimeMills", "0")),
                             "%9.2f(%s,%sms)" % (out_tps, t.get("pullThreadPoolQueueSize", "0"),
                                                 t.get("pullThreadPoolQueueHeadWaitTimeMills", "0")),
                             t.get("pageCacheLockTimeMills", "0"), "%2.2f" % hours,
                             "%.4f" % _float(t.get("commitLogDiskRatio")), t.get("brokerRole", "?"),
                             t.get("commitLogMaxOffset", "?"), _replication(t)))
    return 0


def _replication(table: dict) -> str:
    if "dLegerRole" in table:
        return _dledger_state(table)
    return _slave_acks(table)


def _dledger_state(t: dict) -> str:
    """'dledger n0 LEADER term=3 commit=120 last=120 (n1 lag 0, n2 lag 2)'."""
    out = (f"dledger {t.get('dLegerSelfId', '?')} {t.get('dLegerRole', '?')} term={t.get('dLegerTerm', '?')} "
           f"commit={t.get('dLegerCommitIndex', '?')} last={t.get('dLegerLastIndex', '?')}")
    followers = []
    for item in filter(None, t.get("dLegerFollowers", "").split(";")):
        parts = item.split(":")
        fields = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        followers.append(f"{parts[0]} lag {fields.get('lag', '?')}")
    if followers:
        out += " (" + ", ".join(followers) + ")"
    elif t.get("dLegerLeaderId") and t.get("dLegerRole") != "LEADER":
        out += f" leader={t['dLegerLeaderId']}"
    return out


def _slave_acks(table: dict) -> str:
    """'127.0.0.1:40112 ack=1234 (lag 0)' per slave from the runtime info's
    `slaves` entry ("addr:ack=N:lag=M;..."), '-' on a slave or without slaves."""
    raw = table.get("slaves") or ""
    out = []
    for item in filter(None, raw.split(";")):
        parts = item.split(":")
        fields = dict(p.split("=", 1) for p in parts if "=" in p)
        addr = ":".join(p for p in parts if "=" not in p)
        out.append(f"{addr} ack={fields.get('ack', '?')} (lag {fields.get('lag', '?')})")
    return ", ".join(out) or "-"


async def topic_list(admin: AdminClient, args) -> int:
    """One topic a line; with -c (TopicListSubCommand's clusterModel) the cluster and each
    consuming group of every topic but %RETRY% and %DLQ% ones, one row a group."""
    topics = await admin.topic_list()
    if not args.clusterModel:
        for topic in topics:
            print(topic)
        return 0
    info = await admin.cluster_info()
    cluster_of = {name: c for c, names in info.cluster_addr_table.items() for name in names}
    fmt = "%-20s  %-48s  %-48s"
    print(fmt % ("#Cluster Name", "#Topic", "#Consumer Group"))
    for topic in topics:
        if topic.startswith(("%RETRY%", "%DLQ%")):
            continue
        cluster, groups = "", []
        try:
            route = await admin.topic_route(topic)
            if route.broker_datas:
                cluster = cluster_of.get(route.broker_datas[0].broker_name, "")
            groups = await admin.consumed_by(topic)
        except (MQClientError, RemotingError):
            pass
        for group in groups or [""]:
            print(fmt % (cluster, topic, group))
    return 0


async def topic_cluster_list(admin: AdminClient, args) -> int:
    for cluster in await admin.topic_clusters(args.topic):
        print(cluster)
    return 0


async def topic_route(admin: AdminClient, args) -> int:
    route = await admin.topic_route(args.topic)
    print(json.dumps(route.as_json(), indent=2, sort_keys=True))
    return 0


async def topic_status(admin: AdminClient, args) -> int:
    rows = await admin.topic_status(args.topic)
    fmt = "%-32s  %-4s  %-20s  %-20s    %s"
    print(fmt % ("#Broker Name", "#QID", "#Min Offset", "#Max Offset", "#Last Updated"))
    for r in rows:
        ts = _int(r.get("lastUpdateTimestamp"))
        print(fmt % (r.get("brokerName", ""), r.get("queueId", ""), r.get("minOffset", ""), r.get("maxOffset", ""),
                     _format_ms(ts) if ts > 0 else ""))
    return 0


async def update_topic(admin: AdminClient, args) -> int:
    try:
        attrs = apply_attributes({}, args.attributes or "")
    except MalformedError as e:
        raise SystemExit(f"mqadmin updateTopic: error: -a: {e}") from None
    config = TopicConfig(args.topic, args.readQueueNums, args.writeQueueNums, args.perm, order=args.order,
                         attributes=attrs)
    addrs = await admin.create_topic(config, cluster=args.clusterName, broker_addr=args.brokerAddr)
    for addr in addrs:
        print(f"create topic to {addr} success.")
    print(config)
    return 0


async def update_acl_config(admin: AdminClient, args) -> int:
    ext = {"accessKey": args.accessKey, "secretKey": args.secretKey, "whiteRemoteAddress": args.whiteRemoteAddress,
           "defaultTopicPerm": args.defaultTopicPerm, "defaultGroupPerm": args.defaultGroupPerm,
           "topicPerms": args.topicPerms, "groupPerms": args.groupPerms,
           "admin": None if args.admin is None else str(args.admin).lower()}
    for addr in await admin.acl_edit(R.UPDATE_AND_CREATE_ACL_CONFIG, ext, cluster=args.clusterName,
                                     broker_addr=args.brokerAddr):
        print(f"create or update plain access config to {addr} success.")
    return 0


async def delete_acl_config(admin: AdminClient, args) -> int:
    for addr in await admin.acl_edit(R.DELETE_ACL_CONFIG, {"accessKey": args.accessKey}, cluster=args.clusterName,
                                     broker_addr=args.brokerAddr):
        print(f"delete plain access config account from {addr} success.")
    return 0


async def update_global_white_addr(admin: AdminClient, args) -> int:
    for addr in await admin.acl_edit(R.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, {"globalWhiteAddrs": args.globalWhiteRemoteAddresses},
                                     cluster=args.clusterName, broker_addr=args.brokerAddr):
        print(f"update global white remote addresses to {addr} success.")
    return 0


async def delete_topic(admin: AdminClient, args) -> int:
    await admin.delete_topic(args.topic, args.clusterName)
    print(f"delete topic [{args.topic}] from cluster [{args.clusterName}] success.")
    print(f"delete topic [{args.topic}] from NameServer success.")
    return 0


async def consumer_progress(admin: AdminClient, args) -> int:
    """One group's queues (with -g), or, as RocketMQ's without -g, one line per group that has a
    %RETRY% topic: online consumers, their lowest version, type, model, TPS and diff total."""
    if not args.groupName:
        return await _all_groups_progress(admin)
    stats = await admin.consumer_progress(args.groupName, args.topic)
    fmt = "%-64s  %-32s  %-4s  %-20s  %-20s  %-20s %-20s  %s"
    print(fmt % ("#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Client IP", "#Diff",
                 "#LastTime"))
    for r in stats.rows:
        last = _int(r.get("lastTimestamp"))
        print(fmt % (r.get("topic", ""), r.get("brokerName", ""), r.get("queueId", ""), r.get("brokerOffset", ""),
                     r.get("consumerOffset", ""), "N/A", r["diff"],
                     datetime.fromtimestamp(last / 1000).strftime("%Y-%m-%d %H:%M:%S") if last else "N/A"))
    print()
    print("Consume TPS: %.2f" % stats.consume_tps)
    print("Diff Total: %d" % stats.diff_total)
    return 0


async def _all_groups_progress(admin: AdminClient) -> int:
    from mq.client.admin import version_desc
    fmt = "%-64s  %-6s  %-24s %-5s  %-14s  %-7s  %s"
    print(fmt % ("#Group", "#Count", "#Version", "#Type", "#Model", "#TPS", "#Diff Total"))
    for g in await admin.groups_progress():
        online = g["count"] > 0
        kind = ("PULL" if g["consumeType"] == "CONSUME_ACTIVELY" else "PUSH") if online else ""
        model = g["messageModel"] if online and g["consumeType"] == "CONSUME_PASSIVELY" else ""
        print(fmt % (g["group"], g["count"], version_desc(g["version"]) if online else "OFFLINE", kind, model or "",
                     int(g["consumeTps"]), g["diffTotal"]))
    return 0


async def broker_status(admin: AdminClient, args) -> int:
    addrs = await _broker_addrs(admin, args)
    for addr in addrs:
        table = await admin.broker_runtime_info(addr)
        for k in sorted(table):
            if len(addrs) > 1:
                print("%-24s %-32s: %s" % (addr, k, table[k]))
            else:
                print("%-32s: %s" % (k, table[k]))
    return 0


async def get_broker_config(admin: AdminClient, args) -> int:
    for addr in await _broker_addrs(admin, args):
        config = await admin.broker_config(addr)
        print(f"============{addr}============")
        for k in sorted(config):
            print("%-50s=  %s" % (k, config[k]))
    return 0


async def query_msg_by_offset(admin: AdminClient, args) -> int:
    _print_message(await admin.query_msg_by_offset(args.topic, args.brokerName, args.queueId, args.offset))
    return 0


def _print_message(m) -> None:
    """A message the way RocketMQ's QueryMsgById/ByOffset print it."""
    row = "%-20s %s"
    print(row % ("OffsetID:", m.offset_msg_id))
    print(row % ("Message ID:", m.msg_id))
    print(row % ("Topic:", m.topic))
    print(row % ("Tags:", f"[{m.tags}]"))
    print(row % ("Keys:", f"[{m.keys}]"))
    print(row % ("Queue ID:", m.queue_id))
    print(row % ("Queue Offset:", m.queue_offset))
    print(row % ("CommitLog Offset:", m.commitlog_offset))
    print(row % ("Reconsume Times:", m.reconsume_times))
    print(row % ("Born Timestamp:", _format_ms(m.born_timestamp_ms)))
    print(row % ("Store Timestamp:", _format_ms(m.store_timestamp_ms)))
    print(row % ("Born Host:", m.born_host))
    print(row % ("Store Host:", m.store_host))
    print(row % ("System Flag:", m.sys_flag))
    print(row % ("Properties:", _props_text(m)))
    print(row % ("Message Body:", _body_text(m.body)))


def _props_text(m) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in m.properties.items()) + "}"


def _msg_line(m, body: str) -> str:
    """One message as RocketMQ's printMsg and consumeMessage print it: msgId, MessageExt, body."""
    return (f"MSGID: {m.msg_id} MessageExt [brokerName={m.broker_name}, queueId={m.queue_id}, "
            f"storeSize={m.store_size}, queueOffset={m.queue_offset}, sysFlag={m.sys_flag}, "
            f"bornTimestamp={m.born_timestamp_ms}, bornHost={m.born_host}, storeTimestamp={m.store_timestamp_ms}, "
            f"storeHost={m.store_host}, msgId={m.offset_msg_id}, commitLogOffset={m.commitlog_offset}, "
            f"reconsumeTimes={m.reconsume_times}, topic={m.topic}, properties={_props_text(m)}] BODY: {body}")


def _body_text(body: bytes, charset: str = "utf-8") -> str:
    try:
        return body.decode(charset)
    except (UnicodeDecodeError, LookupError):
        return repr(body)


async def _print_with_track(admin: AdminClient, m) -> None:
    """The message, then which consumer groups have consumed it (RocketMQ's MessageTrack lines)."""
    _print_message(m)
    track = await admin.message_track(m)
    if not track:
        print("\n\nWARN: No Consumer")
        return
    print()
    for group, kind in track:
        print(f"MessageTrack [consumerGroup={group}, trackType={kind}, exceptionDesc=null]")


async def query_msg_by_id(admin: AdminClient, args) -> int:
    """An offset msgId is read where it says (VIEW_MESSAGE_BY_ID); anything else, or an offset
    msgId of no broker here, is looked up as a unique key when the topic is given."""
    from mq.wire.errors import WireError
    for msg_id in [i.strip() for i in args.msgId.split(",") if i.strip()]:
        try:
            m = await admin.view_message_by_id(msg_id)
        except (WireError, MQClientError) as e:
            if not args.topic:
                raise MQClientError(f"{msg_id}: {e}") from None
            found = await admin.query_message(args.topic, msg_id, unique=True)
            if not found:
                raise MQClientError(f"no message with msgId {msg_id} in topic {args.topic}") from None
            m = found[-1]
        await _print_with_track(admin, m)
    return 0


async def query_msg_by_unique_key(admin: AdminClient, args) -> int:
    found = await admin.query_message(args.topic, args.msgId, unique=True)
    if not found:
        raise MQClientError(f"no message with unique key {args.msgId} in topic {args.topic}")
    for m in (found if args.showAll else found[-1:]):     # oldest first: a resend repeats the key
        await _print_with_track(admin, m)
    return 0


async def query_msg_by_key(admin: AdminClient, args) -> int:
    found = await admin.query_message(args.topic, args.msgKey, args.maxNum, args.beginTimestamp,
                                      args.endTimestamp)
    print("%-50s %4s %40s" % ("#Message ID", "#QID", "#Offset"))
    for m in found:
        print("%-50s %4d %40d" % (m.msg_id, m.queue_id, m.queue_offset))
    return 0


async def print_msg(admin: AdminClient, args) -> int:
    async for m in admin.messages_from(args.topic, begin_ms=args.beginTimestamp, end_ms=args.endTimestamp,
                                       sub_expression=args.subExpression):
        print(_msg_line(m, _body_text(m.body, args.charsetName) if args.printBody else "NOT PRINT BODY"))
    return 0


# ---- groups, offsets, permissions, config ---------------------------------------------------------------
async def update_sub_group(admin: AdminClient, args) -> int:
    config = {"groupName": args.groupName, "consumeEnable": args.consumeEnable,
              "consumeFromMinEnable": args.consumeFromMinEnable, "consumeBroadcastEnable": args.consumeBroadcastEnable,
              "retryQueueNums": args.retryQueueNums, "retryMaxTimes": args.retryMaxTimes, "brokerId": args.brokerId,
              "whichBrokerWhenConsumeSlowly": args.whichBrokerWhenConsumeSlowly,
              "notifyConsumerIdsChangedEnable": args.notifyConsumerIdsChangedEnable,
              "consumeMessageOrderly": args.consumeMessageOrderly}
    for addr in await admin.update_sub_group(config, cluster=args.clusterName, broker_addr=args.brokerAddr):
        print(f"create subscription group to {addr} success.")
    print("SubscriptionGroupConfig [" + ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                                                   for k, v in config.items()) + "]")
    return 0


async def delete_sub_group(admin: AdminClient, args) -> int:
    where = dict(cluster=args.clusterName, broker_addr=args.brokerAddr)
    for addr in await admin.delete_sub_group(args.groupName, args.removeOffset, **where):
        print(f"delete subscription group [{args.groupName}] from broker [{addr}] success.")
    if args.clusterName:                    # as RocketMQ: the group's retry and dead-letter topics go too
        for topic in (f"%RETRY%{args.groupName}", f"%DLQ%{args.groupName}"):
            try:
                await admin.delete_topic(topic, args.clusterName)
                print(f"delete topic [{topic}] from cluster [{args.clusterName}] success.")
            except MQClientError as e:
                print(f"delete topic [{topic}] from cluster [{args.clusterName}] failed: {e}")
    return 0


async def reset_offset_by_time(admin: AdminClient, args) -> int:
    ts = -1 if args.timestamp == "now" else _timestamp(args.timestamp)
    rows = await admin.reset_offset_by_time(args.topic, args.group, ts, args.force)
    print("rollback consumer offset by specified group[%s], topic[%s], force[%s], timestamp(string)[%s], "
          "timestamp(long)[%s]" % (args.group, args.topic, str(args.force).lower(), args.timestamp, ts))
    fmt = "%-40s  %-40s  %-40s"
    print(fmt % ("#brokerName", "#queueId", "#offset"))
    for broker, q, offset in rows:
        print(fmt % (broker, q, offset))
    return 0


async def write_perm(admin: AdminClient, args, add: bool) -> int:
    verb = "add" if add else "wipe"
    for ns, count in await admin.write_perm(args.brokerName, add):
        print(f"{verb} write perm of broker[{args.brokerName}] in name server[{ns}] OK, {count}")
    return 0


async def wipe_write_perm(admin: AdminClient, args) -> int:
    return await write_perm(admin, args, add=False)


async def add_write_perm(admin: AdminClient, args) -> int:
    return await write_perm(admin, args, add=True)


async def update_broker_config(admin: AdminClient, args) -> int:
    for addr in await admin.update_broker_config({args.key: args.value}, cluster=args.clusterName,
                                                 broker_addr=args.brokerAddr):
        print(f"update broker config success, {addr}")
    return 0


def _connection_row(i: int, c: dict) -> str:
    return "%04d  %-32s %-22s %-8s %s" % (i, c.get("clientId", ""), c.get("clientAddr", ""), c.get("language", ""),
                                          c.get("version", ""))


async def producer_connection(admin: AdminClient, args) -> int:
    for i, c in enumerate(await admin.producer_connections(args.producerGroup, args.topic), 1):
        print(_connection_row(i, c))
    return 0


async def consumer_connection(admin: AdminClient, args) -> int:
    cc = await admin.consumer_connection(args.consumerGroup, args.brokerAddr)
    for i, c in enumerate(cc.get("connectionSet", []), 1):
        print(_connection_row(i, c))
    print("\nBelow is subscription:")
    for i, (topic, sd) in enumerate(sorted(cc.get("subscriptionTable", {}).items()), 1):
        print("%04d  Topic: %-40s SubExpression: %s" % (i, topic, sd.get("subString", "*")))
    print()
    print(f"ConsumeType: {cc.get('consumeType')}")
    print(f"MessageModel: {cc.get('messageModel')}")
    print(f"ConsumeFromWhere: {cc.get('consumeFromWhere')}")
    return 0


async def broker_consume_stats(admin: AdminClient, args) -> int:
    stats = await admin.broker_consume_stats(args.brokerAddr, args.order, args.timeoutMillis)
    fmt = "%-64s  %-64s  %-32s  %-4s  %-20s  %-20s  %-20s %s"
    print(fmt % ("#Topic", "#Group", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Diff",
                 "#LastTime"))
    for group, parts in sorted(stats["groups"]):
        for rows, _tps in parts:
            for r in rows:
                if r["diff"] < args.level:
                    continue
                last = r.get("lastTimestamp", 0)
                print(fmt % (r["topic"], group, r["brokerName"], r["queueId"], r["brokerOffset"],
                             r["consumerOffset"], r["diff"], _format_ms(last) if last else "N/A"))
    print(f"\nDiff Total: {stats['totalDiff']}")
    return 0


async def stats_all(admin: AdminClient, args) -> int:
    """StatsAllSubCommand: per topic and consuming group, the backlog, the last minute's in and
    out TPS and the last day's in and out messages, summed over the masters of the route."""
    topics = [args.topic] if args.topic else await admin.topic_list()
    fmt = "%-64s  %-64s %12s %11s %11s %14s %14s"
    print(fmt % ("#Topic", "#Consumer Group", "#Accumulation", "#InTPS", "#OutTPS", "#InMsg24Hour",
                 "#OutMsg24Hour"))

    async def stats(masters, name: str, key: str) -> tuple[float, int]:
        tps, day = 0.0, 0
        for _, addr in masters:
            d = await admin.view_broker_stats(addr, name, key)
            if d:
                tps += d["statsMinute"]["tps"]
                day += d["statsDay"]["sum"]
        return tps, day

    for topic in topics:
        if topic.startswith(("%RETRY%", "%DLQ%")):
            continue
        try:
            masters = await admin.masters_of(topic)
            groups = await admin.consumed_by(topic)
        except (MQClientError, RemotingError):
            continue
        in_tps, in_day = await stats(masters, "TOPIC_PUT_NUMS", topic)
        if not groups:
            if not args.activeTopic or in_day > 0:
                print("%-64s  %-64s %12d %11.2f %11s %14d %14s" % (topic, "", 0, in_tps, "", in_day, "NO_CONSUMER"))
            continue
        for group in groups:
            out_tps, out_day = await stats(masters, "GROUP_GET_NUMS", f"{topic}@{group}")
            try:
                backlog = (await admin.consumer_progress(group, topic)).diff_total
            except (MQClientError, RemotingError):
                backlog = 0
            if not args.activeTopic or in_day > 0 or out_day > 0:
                print("%-64s  %-64s %12d %11.2f %11.2f %14d %14d" % (topic, group, backlog, in_tps, out_tps,
                                                                     in_day, out_day))
    return 0


# ---- messages: send, consume, round trips ---------------------------------------------------------------
def _producer(args, group: str):
    from mq.client import Producer
    return Producer(group, args.namesrvAddr, credentials=tools_credentials())


async def send_message(admin: AdminClient, args) -> int:
    from mq.client import Message, MessageQueue
    msg = Message(args.topic, args.body, tags=args.tags, keys=args.keys)
    async with _producer(args, "PID_TOOLS_SEND") as prod:
        if args.brokerName is not None and args.qid is not None:
            r = await prod.send_to_queue(msg, MessageQueue(args.topic, args.brokerName, args.qid))
        elif (args.brokerName is None) != (args.qid is None):
            raise MQClientError("give both -b brokerName and -i queueId, or neither")
        else:
            r = await prod.send(msg)
    fmt = "%-32s  %-4s  %-20s    %s"
    print(fmt % ("#Broker Name", "#QID", "#Send Result", "#MsgId"))
    print(fmt % (r.queue.broker_name, r.queue.queue_id, r.status.value, r.msg_id))
    return 0


async def consume_message(admin: AdminClient, args) -> int:
    """Pulls (group TOOLS_CONSUMER unless -g; nothing committed) and prints up to -c messages, from
    -o OFFSET of one queue (-b and -i), or from the -s time (else the queue's start) of every queue,
    up to the -e time."""
    n = 0
    async for m in admin.messages_from(args.topic, args.brokerName, args.queueId, args.offset,
                                       args.beginTimestamp, args.endTimestamp, args.consumerGroup):
        print(_msg_line(m, _body_text(m.body)))
        n += 1
        if n >= args.messageNumber:
            break
    print(f"Consume ok, {n} message(s)")
    return 0


async def cluster_rt(admin: AdminClient, args) -> int:
    """ClusterRTSubCommand: `amount` sends of `size` bytes to each master's own topic (its
    brokerName), average round trip per broker; -i repeats every N seconds until interrupted
    (RocketMQ always repeats)."""
    from mq.client import Message
    info = await admin.cluster_info()
    clusters = [args.clusterName] if args.clusterName else sorted(info.cluster_addr_table)
    body = b"x" * args.size
    fmt = "%-24s  %-24s  %-4s  %-8s  %-8s"
    async with _producer(args, "PID_SMSC") as prod:
        while True:
            print(fmt % ("#Cluster Name", "#Broker Name", "#RT", "#successCount", "#failCount"))
            for cluster in clusters:
                for name in sorted(info.cluster_addr_table.get(cluster, [])):
                    ok = fail = 0
                    spent = 0.0
                    for _ in range(args.amount):
                        t0 = time.perf_counter()
                        try:
                            await prod.send(Message(name, body))
                            ok += 1
                            spent += time.perf_counter() - t0
                        except (MQClientError, RemotingError):
                            fail += 1
                    print(fmt % (cluster, name, "%.2f" % (spent * 1000 / ok if ok else 0.0), ok, fail))
            if not args.interval:
                return 0
            await asyncio.sleep(args.interval)


async def leadership_transfer(admin: AdminClient, args) -> int:
    """Hands a DLedger group's lead to a member, and says it is done only once that member
    leads: the leader accepts any member (code 200: "started") and gives up by itself when the
    member does not take over within an election timeout, so "started" is not "done".  A member
    whose broker does not answer is refused before anything is sent; a transfer that has not
    happened after -w seconds fails (exit 1) naming who leads."""
    name, target = args.brokerName, args.transfereeId
    g = await admin.dledger_group(name)
    if target not in g["peers"]:
        raise MQClientError(f"{target!r} is not a member of [{name}] (members: {', '.join(sorted(g['peers']))})")
    if target not in g["members"]:
        raise MQClientError(f"{target} is a member of [{name}] but its broker does not answer (down?); "
                            f"a transfer to it cannot complete (answering: {', '.join(sorted(g['members'])) or 'none'})")
    leader = g["leader"]
    if leader is None:
        raise MQClientError(f"[{name}] has no leader right now; try again in a moment")
    if leader == target:
        print(f"{target} already leads [{name}]")
        return 0
    answer = await admin.dledger_transfer(g["peers"][leader], g["group"], target)
    if answer.get("code") != 200:
        raise MQClientError(f"the leader {leader} refused the transfer (code {answer.get('code')}, "
                            f"leader now {answer.get('leaderId')})")
    print(f"leadership transfer of [{name}] from {leader} to {target} started (term {answer.get('term')}); "
          f"waiting up to {args.waitSeconds:g}s for {target} to lead", flush=True)
    deadline = time.monotonic() + args.waitSeconds
    while True:
        try:
            now = await admin.dledger_group(name)
        except MQClientError:
            now = {"leader": None, "members": {}}
        if now["leader"] == target:
            term = now["members"].get(target, {}).get("dLegerTerm", "?")
            print(f"{target} now leads [{name}] (term {term})")
            return 0
        if time.monotonic() > deadline:
            raise MQClientError(f"the leader {leader} accepted the transfer, but {target} does not lead [{name}] "
                                f"after {args.waitSeconds:g}s (leader now: {now['leader'] or 'none'})")
        await asyncio.sleep(0.2)


# ---- name servers: their config, the KV table, order conf ----------------------------------------------
async def get_namesrv_config(admin: AdminClient, args) -> int:
    for ns, config in (await admin.namesrv_config()).items():
        print(f"============{ns}============")
        for k in sorted(config):
            print("%-50s=  %s" % (k, config[k]))
    return 0


async def update_namesrv_config(admin: AdminClient, args) -> int:
    servers = await admin.update_namesrv_config({args.key.strip(): args.value.strip()})
    print(f"update name server config success!{servers}\n{args.key.strip()} : {args.value.strip()}")
    return 0


async def update_kv_config(admin: AdminClient, args) -> int:
    await admin.put_kv_config(args.namespace.strip(), args.key.strip(), args.value.strip())
    print("create or update kv config to namespace success.")
    return 0


async def delete_kv_config(admin: AdminClient, args) -> int:
    await admin.delete_kv_config(args.namespace.strip(), args.key.strip())
    print("delete kv config from namespace success.")
    return 0


async def update_order_conf(admin: AdminClient, args) -> int:
    """UpdateOrderConfCommand: the topic's ORDER_TOPIC_CONFIG KV entry at the name servers
    ("brokerName:queueNum;..."), which a name server with orderMessageEnable=true puts into
    the topic's route as orderTopicConf."""
    from mq.client.admin import NAMESPACE_ORDER_TOPIC_CONFIG as NS
    topic, method = args.topic.strip(), args.method.strip()
    if method == "get":
        print(f"get orderConf success. topic=[{topic}], orderConf=[{await admin.get_kv_config(NS, topic)}]")
    elif method == "put":
        if not args.orderConf:
            raise UsageError("-v orderConf (brokerName:num;...) is required with -m put")
        await admin.put_kv_config(NS, topic, args.orderConf.strip())
        print(f"update orderConf success. topic=[{topic}], orderConf=[{args.orderConf.strip()}]")
    elif method == "delete":
        await admin.delete_kv_config(NS, topic)
        print(f"delete orderConf success. topic=[{topic}]")
    else:
        raise UsageError(f"-m must be get, put or delete, not {method!r}")
    return 0


# ---- topics: permissions ----------------------------------------------------------------------------------
async def update_topic_perm(admin: AdminClient, args) -> int:
    """UpdateTopicPermSubCommand: the topic's config at a broker (or every master of a cluster)
    sent again with a new perm; queue counts and flags are the broker's own from the route (where
    RocketMQ's tool takes the first broker's for all, and compares with a default perm)."""
    route = await admin.topic_route(args.topic)
    info = await admin.cluster_info()
    addrs = [args.brokerAddr] if args.brokerAddr else await admin._cluster_masters(args.clusterName)
    name_of = {a: bd.broker_name for bd in info.broker_addr_table.values() for a in bd.broker_addrs.values()}
    for addr in addrs:
        qd = next((q for q in route.queue_datas if q.broker_name == name_of.get(addr)), None)
        if qd is None:
            raise MQClientError(f"topic [{args.topic}] has no queues on the broker at {addr}")
        if qd.perm == args.perm:
            print(f"new perm equals to the old one! ({addr})")
            continue
        config = TopicConfig(args.topic, qd.read_queue_nums, qd.write_queue_nums, args.perm,
                             topic_sys_flag=qd.topic_sys_flag)
        await admin.create_topic(config, broker_addr=addr)
        print(f"update topic perm from {qd.perm} to {args.perm} in {addr} success.")
        print(config)
    return 0


# ---- groups: offsets, status --------------------------------------------------------------------------------
async def clone_group_offset(admin: AdminClient, args) -> int:
    topic = args.topic.strip() if args.topic else None
    await admin.clone_group_offset(args.srcGroup.strip(), args.destGroup.strip(), topic, args.offline)
    print(f"clone group offset success. srcGroup[{args.srcGroup.strip()}], destGroup=[{args.destGroup.strip()}], "
          f"topic[{topic or ''}]")
    return 0


async def consumer_status(admin: AdminClient, args) -> int:
    """ConsumerStatusSubCommand, from what the brokers know: each online consumer (version,
    address, language), the group's subscriptions, and each subscribed queue with the client
    AllocateMessageQueueAveragely gives it (the default strategy of RocketMQ's clients and
    ours), its offsets and lag.  RocketMQ asks each consumer for its ConsumerRunningInfo
    through the broker (GET_CONSUMER_RUNNING_INFO, 307); this broker does not relay that
    request, so the consumers' own view (process queues, their strategy) is not shown."""
    from mq.client.admin import version_desc
    from mq.client.consumer import allocate_averagely
    group = args.consumerGroup.strip()
    cc = await admin.consumer_connection(group, args.brokerAddr)
    conns = cc.get("connectionSet") or []
    if args.clientId and args.clientId not in {c.get("clientId") for c in conns}:
        raise MQClientError(f"the consumer {args.clientId} of group [{group}] is not online")
    fmt = "%-10s %-40s %-20s %-22s %s"
    print(fmt % ("#Index", "#ClientId", "#Version", "#Addr", "#Language"))
    for i, c in enumerate(conns, 1):
        print(fmt % (i, c.get("clientId"), version_desc(int(c.get("version") or 0)), c.get("clientAddr"),
                     c.get("language")))
    subs = cc.get("subscriptionTable") or {}
    print()
    for topic in sorted(subs):
        print(f"Subscription: {topic}  SubExpression: {subs[topic].get('subString', '*')}")
    model = cc.get("messageModel")
    print(f"ConsumeType: {cc.get('consumeType')}  MessageModel: {model}  ConsumeFromWhere: {cc.get('consumeFromWhere')}")
    cids = sorted(c.get("clientId") for c in conns)
    offsets = {(r["topic"], r["brokerName"], r["queueId"]): r
               for r in (await admin.consumer_progress(group, allow_empty=True)).rows}
    print()
    fmt = "%-48s  %-24s  %-4s  %-40s  %-14s  %-16s  %s"
    print(fmt % ("#Topic", "#Broker Name", "#QID", "#Client (AllocateMessageQueueAveragely)", "#Broker Offset",
                 "#Consumer Offset", "#Diff"))
    for topic in sorted(subs):
        try:
            mqs = sorted((await admin.topic_route(topic)).subscribe_queues(topic),
                         key=lambda q: (q.broker_name, q.queue_id))
        except (MQClientError, RemotingError):
            continue
        owner = {}
        for cid in cids:
            for mq in (mqs if model == "BROADCASTING" else allocate_averagely(mqs, cids, cid)):
                owner.setdefault((mq.broker_name, mq.queue_id), []).append(cid)
        for mq in mqs:
            holders = owner.get((mq.broker_name, mq.queue_id), [])
            if args.clientId and args.clientId not in holders:
                continue
            r = offsets.get((topic, mq.broker_name, mq.queue_id), {})
            print(fmt % (topic, mq.broker_name, mq.queue_id, ",".join(holders) or "-", r.get("brokerOffset", "-"),
                         r.get("consumerOffset", "-"), r.get("diff", "-")))
    print("\nNOTE: the queue owners are computed, not reported: this broker does not relay "
          "GET_CONSUMER_RUNNING_INFO (307) to consumers")
    return 0


# ---- queues ---------------------------------------------------------------------------------------------------
async def query_cq(admin: AdminClient, args) -> int:
    """QueryConsumeQueueCommand: entries of one ConsumeQueue from an index, at -b or at the
    master of the route's first broker; with -g the group's subscription of the topic."""
    addr = args.broker
    if not addr:
        route = await admin.topic_route(args.topic)
        addr = next((bd.master_addr for bd in route.broker_datas if bd.master_addr), None)
        if addr is None:
            raise MQClientError("No topic route data!")
    body, remark = await admin.query_consume_queue(addr, args.topic, args.queue, args.index, args.count,
                                                   args.consumer)
    if body is None:
        raise MQClientError(remark or f"no answer body from {addr}")
    if body.get("subscriptionData") is not None:
        print("Subscription data: \n%s" % json.dumps(body["subscriptionData"], indent=4, sort_keys=True))
        print("======================================")
    if body.get("filterData") is not None:
        print(f"Filter data: \n{body['filterData']}")
        print("======================================")
    print(f"Queue data: \nmax: {body.get('maxQueueIndex')}, min: {body.get('minQueueIndex')}")
    print("======================================")
    for i, e in enumerate(body.get("queueData") or [], args.index):
        print(f"idx: {i}")
        print("ConsumeQueueData{physicOffset=%d, physicSize=%d, tagsCode=%d, extendDataJson='%s', bitMap='%s', "
              "eval=%s, msg='%s'}" % (e.get("physicOffset"), e.get("physicSize"), e.get("tagsCode"),
                                     e.get("extendDataJson"), e.get("bitMap"), str(e.get("eval", False)).lower(),
                                     e.get("msg")))
        print("======================================")
    return 0


async def send_msg_status(admin: AdminClient, args) -> int:
    """SendMsgStatusCommand: -c messages of -s bytes to the broker's own topic (its name), one
    line each with the round trip and the send result."""
    from mq.client import Message
    async with _producer(args, "PID_SMSC") as prod:
        await prod.send(Message(args.brokerName, b"x" * 16))            # warm up: route and connection
        for _ in range(args.count):
            t0 = time.perf_counter()
            r = await prod.send(Message(args.brokerName, b"a" * args.messageSize))
            rt_ms = (time.perf_counter() - t0) * 1000
            q = r.queue
            print(f"rt={rt_ms:.0f}ms, SendResult=SendResult [sendStatus={r.status.value}, msgId={r.msg_id}, "
                  f"offsetMsgId={r.offset_msg_id}, messageQueue=MessageQueue [topic={q.topic}, "
                  f"brokerName={q.broker_name}, queueId={q.queue_id}], queueOffset={r.queue_offset}]")
    return 0


async def _broker_addrs(admin: AdminClient, args) -> list[str]:
    if args.brokerAddr:
        return [args.brokerAddr]
    info = await admin.cluster_info()
    if args.clusterName not in info.cluster_addr_table:
        raise MQClientError(f"cluster [{args.clusterName}] not found (known clusters: "
                            f"{', '.join(sorted(info.cluster_addr_table)) or 'none'})")
    return info.master_addrs(args.clusterName)


def _first_float(text) -> float:
    return _float((text or "0").split()[0] if (text or "").split() else "0")


def _float(text) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return 0.0


def _int(text) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        return 0


def _format_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]


# --------------------------------------------------------------------------------------------------
# Command line

def _bool(text: str) -> bool:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


def _timestamp(text: str) -> int:
    """A time as RocketMQ's tools take it: milliseconds, or yyyy-MM-dd#HH:mm:ss:SSS (local time)."""
    if text.strip().isdigit():
        return int(text)
    try:
        return int(datetime.strptime(text.strip(), "%Y-%m-%d#%H:%M:%S:%f").timestamp() * 1000)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither milliseconds nor yyyy-MM-dd#HH:mm:ss:SSS") from None


def _nonneg(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {v}")
    return v


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # argparse's own exit code 2, one clear line plus usage
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


COMMANDS = {
    # name: (function, help, [(flags, kwargs), ...], [mutually exclusive required groups])
    "clusterList": (cluster_list, "List clusters, their brokers and load", [], []),
    "topicList": (topic_list, "Fetch all topic list from name server",
                  [(("-c", "--clusterModel"), dict(action="store_true",
                                                   help="with each topic's cluster and consumer groups"))], []),
    "topicClusterList": (topic_cluster_list, "Get cluster info for topic",
                         [(("-t", "--topic"), dict(required=True, help="topic name"))], []),
    "updateTopicPerm": (update_topic_perm, "Update the permission of a topic on brokers",
                        [(("-t", "--topic"), dict(required=True, help="topic name")),
                         (("-p", "--perm"), dict(type=_nonneg, required=True, help="permission: 2 W, 4 R, 6 RW"))],
                        [[(("-b", "--brokerAddr"), dict(help="on this broker")),
                          (("-c", "--clusterName"), dict(help="on every master of this cluster"))]]),
    "updateOrderConf": (update_order_conf, "Create, update, get or delete the order conf of a topic "
                        "(name server KV, namespace ORDER_TOPIC_CONFIG)",
                        [(("-t", "--topic"), dict(required=True, help="topic name")),
                         (("-v", "--orderConf"), dict(help="brokerName1:num;brokerName2:num (with -m put)")),
                         (("-m", "--method"), dict(required=True, help="put, get or delete"))], []),
    "getNamesrvConfig": (get_namesrv_config, "Get configs of name server", [], []),
    "updateNamesrvConfig": (update_namesrv_config, "Update configs of name server (the keys safe at run time)",
                            [(("-k", "--key"), dict(required=True, help="config key")),
                             (("-v", "--value"), dict(required=True, help="config value"))], []),
    "updateKvConfig": (update_kv_config, "Create or update KV config (every name server)",
                       [(("-s", "--namespace"), dict(required=True, help="the namespace")),
                        (("-k", "--key"), dict(required=True, help="the key name")),
                        (("-v", "--value"), dict(required=True, help="the key value"))], []),
    "deleteKvConfig": (delete_kv_config, "Delete KV config (every name server)",
                       [(("-s", "--namespace"), dict(required=True, help="the namespace")),
                        (("-k", "--key"), dict(required=True, help="the key name"))], []),
    "cloneGroupOffset": (clone_group_offset, "Clone offset from other group",
                         [(("-s", "--srcGroup"), dict(required=True, help="source consumer group")),
                          (("-d", "--destGroup"), dict(required=True, help="destination consumer group")),
                          (("-t", "--topic"), dict(help="the topic (every topic of the source group)")),
                          (("-o", "--offline"), dict(type=_bool, default=False,
                                                     help="the source group is offline (false): clone topics its "
                                                          "online consumers do not subscribe too"))], []),
    "consumerStatus": (consumer_status, "A consumer group's online clients, subscriptions and queues",
                       [(("-g", "--consumerGroup"), dict(required=True, help="consumer group name")),
                        (("-i", "--clientId"), dict(help="only this client")),
                        (("-b", "--brokerAddr"), dict(help="ask this broker")),
                        (("-s", "--jstack"), dict(action="store_true", help="accepted; no thread stacks here"))], []),
    "queryCq": (query_cq, "Query cq command (ConsumeQueue entries)",
                [(("-t", "--topic"), dict(required=True, help="topic name")),
                 (("-q", "--queue"), dict(type=_nonneg, required=True, help="queue id, e.g. 1")),
                 (("-i", "--index"), dict(type=_nonneg, required=True, help="start queue index")),
                 (("-c", "--count"), dict(type=_nonneg, default=10, help="how many (10)")),
                 (("-b", "--broker"), dict(help="broker address (the master of the route's first broker)")),
                 (("-g", "--consumer"), dict(help="consumer group: also show its subscription"))], []),
    "sendMsgStatus": (send_msg_status, "Send messages to a broker's own topic and print each round trip",
                      [(("-b", "--brokerName"), dict(required=True, help="broker name")),
                       (("-s", "--messageSize"), dict(type=_nonneg, default=128, help="message size (128)")),
                       (("-c", "--count"), dict(type=_nonneg, default=50, help="send message count (50)"))], []),
    "topicRoute": (topic_route, "Examine topic route info",
                   [(("-t", "--topic"), dict(required=True, help="topic name"))], []),
    "topicStatus": (topic_status, "Examine topic status info (queue offsets)",
                    [(("-t", "--topic"), dict(required=True, help="topic name"))], []),
    "updateTopic": (update_topic, "Update or create topic",
                    [(("-t", "--topic"), dict(required=True, help="topic name")),
                     (("-r", "--readQueueNums"), dict(type=_nonneg, default=8, help="read queue nums (8)")),
                     (("-w", "--writeQueueNums"), dict(type=_nonneg, default=8, help="write queue nums (8)")),
                     (("-p", "--perm"), dict(type=_nonneg, default=6, help="permission: 2 W, 4 R, 6 RW (6)")),
                     (("-o", "--order"), dict(type=_bool, default=False, help="order topic (true|false)")),
                     (("-a", "--attributes"), dict(help="RocketMQ 5's topic attributes, e.g. +message.type=FIFO "
                                                        "(NORMAL, FIFO, DELAY, TRANSACTION, MIXED)"))],
                    [[(("-b", "--brokerAddr"), dict(help="create the topic on this broker")),
                      (("-c", "--clusterName"), dict(help="create the topic on every master of this cluster"))]]),
    "deleteTopic": (delete_topic, "Delete topic from brokers and name servers",
                    [(("-t", "--topic"), dict(required=True, help="topic name")),
                     (("-c", "--clusterName"), dict(required=True, help="delete the topic from this cluster"))], []),
    "updateAclConfig": (update_acl_config, "Update or create an ACL account in plain_acl.yml (aclEnable brokers)",
                        [(("-a", "--accessKey"), dict(required=True, help="the account's access key")),
                         (("-s", "--secretKey"), dict(help="secret key (required for a new account)")),
                         (("-w", "--whiteRemoteAddress"), dict(help="address pattern that skips the checks")),
                         (("-i", "--defaultTopicPerm"), dict(help="DENY, PUB, SUB or PUB|SUB")),
                         (("-u", "--defaultGroupPerm"), dict(help="DENY, PUB, SUB or PUB|SUB")),
                         (("-t", "--topicPerms"), dict(help="topicA=PUB,topicB=SUB")),
                         (("-g", "--groupPerms"), dict(help="groupA=SUB,groupB=DENY")),
                         (("-m", "--admin"), dict(type=_bool, help="admin account (true|false)"))],
                        [[(("-b", "--brokerAddr"), dict(help="this broker")),
                          (("-c", "--clusterName"), dict(help="every master of this cluster"))]]),
    "deleteAclConfig": (delete_acl_config, "Delete an ACL account from plain_acl.yml",
                        [(("-a", "--accessKey"), dict(required=True, help="the account's access key"))],
                        [[(("-b", "--brokerAddr"), dict(help="this broker")),
                          (("-c", "--clusterName"), dict(help="every master of this cluster"))]]),
    "updateGlobalWhiteAddr": (update_global_white_addr, "Set the global white remote addresses of plain_acl.yml",
                              [(("-g", "--globalWhiteRemoteAddresses"),
                                dict(required=True, help="comma-separated patterns, e.g. 10.10.103.*,192.168.0.*"))],
                              [[(("-b", "--brokerAddr"), dict(help="this broker")),
                                (("-c", "--clusterName"), dict(help="every master of this cluster"))]]),
    "consumerProgress": (consumer_progress, "Query consumer progress (offsets and lag per queue)",
                         [(("-g", "--groupName"), dict(help="consumer group name (none: every group)")),
                          (("-t", "--topic"), dict(help="only this topic"))], []),
    "brokerStatus": (broker_status, "Fetch broker runtime status data", [],
                     [[(("-b", "--brokerAddr"), dict(help="broker address")),
                       (("-c", "--clusterName"), dict(help="every master of this cluster"))]]),
    "getBrokerConfig": (get_broker_config, "Get broker config by cluster or special broker", [],
                        [[(("-b", "--brokerAddr"), dict(help="broker address")),
                          (("-c", "--clusterName"), dict(help="every master of this cluster"))]]),
    "queryMsgByOffset": (query_msg_by_offset, "Query message by queue offset",
                         [(("-t", "--topic"), dict(required=True, help="topic name")),
                          (("-b", "--brokerName"), dict(required=True, help="broker name")),
                          (("-i", "--queueId"), dict(type=_nonneg, required=True, help="queue id")),
                          (("-o", "--offset"), dict(type=_nonneg, required=True, help="queue offset"))], []),
    "queryMsgById": (query_msg_by_id, "Query message by id (offset msgId, or a unique key with -t)",
                     [(("-i", "--msgId"), dict(required=True, help="msgId(s), comma-separated")),
                      (("-t", "--topic"), dict(help="topic: look the id up as a unique key when it is no offset msgId"))],
                     []),
    "queryMsgByUniqueKey": (query_msg_by_unique_key, "Query message by unique key (the msgId producers print)",
                            [(("-i", "--msgId"), dict(required=True, help="the unique key (UNIQ_KEY)")),
                             (("-t", "--topic"), dict(required=True, help="topic name")),
                             (("-a", "--showAll"), dict(action="store_true", help="print every copy found"))], []),
    "queryMsgByKey": (query_msg_by_key, "Query message by key",
                      [(("-t", "--topic"), dict(required=True, help="topic name")),
                       (("-k", "--msgKey"), dict(required=True, help="message key")),
                       (("-b", "--beginTimestamp"), dict(type=_timestamp, default=0,
                                                          help="ms or yyyy-MM-dd#HH:mm:ss:SSS (0)")),
                       (("-e", "--endTimestamp"), dict(type=_timestamp, default=2 ** 63 - 1,
                                                        help="ms or yyyy-MM-dd#HH:mm:ss:SSS (no end)")),
                       (("-c", "--maxNum"), dict(type=_nonneg, default=64, help="most messages (64)"))], []),
    "printMsg": (print_msg, "Print the messages of a topic (a time range of every queue)",
                 [(("-t", "--topic"), dict(required=True, help="topic name")),
                  (("-c", "--charsetName"), dict(default="utf-8", help="body charset (utf-8)")),
                  (("-s", "--subExpression"), dict(default="*", help="tag expression (*)")),
                  (("-b", "--beginTimestamp"), dict(type=_timestamp, default=0,
                                                     help="ms or yyyy-MM-dd#HH:mm:ss:SSS (0)")),
                  (("-e", "--endTimestamp"), dict(type=_timestamp, default=None,
                                                   help="ms or yyyy-MM-dd#HH:mm:ss:SSS (the queue's end)")),
                  (("-d", "--printBody"), dict(type=_bool, default=True, help="print bodies (true)"))], []),
    "updateSubGroup": (update_sub_group, "Update or create subscription group",
                       [(("-g", "--groupName"), dict(required=True, help="consumer group name")),
                        (("-s", "--consumeEnable"), dict(type=_bool, default=True, help="consume enable (true)")),
                        (("-m", "--consumeFromMinEnable"), dict(type=_bool, default=False,
                                                                 help="consume from min offset enable (false)")),
                        (("-d", "--consumeBroadcastEnable"), dict(type=_bool, default=False,
                                                                   help="broadcast consumption enable (false)")),
                        (("-q", "--retryQueueNums"), dict(type=_nonneg, default=1, help="retry queue nums (1)")),
                        (("-r", "--retryMaxTimes"), dict(type=_nonneg, default=16, help="retry max times (16)")),
                        (("-i", "--brokerId"), dict(type=_nonneg, default=0, help="consume from this broker id (0)")),
                        (("-w", "--whichBrokerWhenConsumeSlowly"), dict(type=_nonneg, default=1,
                                                                         help="broker id when consuming slowly (1)")),
                        (("-a", "--notifyConsumerIdsChangedEnable"), dict(type=_bool, default=True,
                                                                           help="notify consumer ids changed (true)")),
                        (("-o", "--consumeMessageOrderly"), dict(type=_bool, default=False,
                                                                  help="orderly (FIFO) consumption for 5.x clients "
                                                                       "(RocketMQ 5's key; false)"))],
                       [[(("-b", "--brokerAddr"), dict(help="create the group on this broker")),
                         (("-c", "--clusterName"), dict(help="create the group on every master of this cluster"))]]),
    "deleteSubGroup": (delete_sub_group, "Delete subscription group from brokers",
                       [(("-g", "--groupName"), dict(required=True, help="consumer group name")),
                        (("-r", "--removeOffset"), dict(type=_bool, default=False,
                                                         help="also delete the group's offsets (false)"))],
                       [[(("-b", "--brokerAddr"), dict(help="delete the group from this broker")),
                         (("-c", "--clusterName"), dict(help="from every master of this cluster, with its "
                                                             "%%RETRY%% and %%DLQ%% topics"))]]),
    "resetOffsetByTime": (reset_offset_by_time, "Reset consumer offset by timestamp (online consumers are told)",
                          [(("-g", "--group"), dict(required=True, help="consumer group name")),
                           (("-t", "--topic"), dict(required=True, help="topic name")),
                           (("-s", "--timestamp"), dict(required=True,
                                                        help="'now', ms, or yyyy-MM-dd#HH:mm:ss:SSS")),
                           (("-f", "--force"), dict(type=_bool, default=True,
                                                    help="also move offsets forward (true); false: only back"))],
                          []),
    "wipeWritePerm": (wipe_write_perm, "Wipe write perm of broker in all name server",
                      [(("-b", "--brokerName"), dict(required=True, help="broker name"))], []),
    "addWritePerm": (add_write_perm, "Add write perm of broker in all name server",
                     [(("-b", "--brokerName"), dict(required=True, help="broker name"))], []),
    "updateBrokerConfig": (update_broker_config, "Update broker's config (the keys safe to change while it runs)",
                           [(("-k", "--key"), dict(required=True, help="config key")),
                            (("-v", "--value"), dict(required=True, help="config value"))],
                           [[(("-b", "--brokerAddr"), dict(help="this broker")),
                             (("-c", "--clusterName"), dict(help="every master of this cluster"))]]),
    "producerConnection": (producer_connection, "Query producer's socket connection and client version",
                           [(("-g", "--producerGroup"), dict(required=True, help="producer group name")),
                            (("-t", "--topic"), dict(required=True, help="a topic the group sends to"))], []),
    "consumerConnection": (consumer_connection, "Query consumer's socket connection, client version and subscription",
                           [(("-g", "--consumerGroup"), dict(required=True, help="consumer group name")),
                            (("-b", "--brokerAddr"), dict(help="ask this broker"))], []),
    "brokerConsumeStats": (broker_consume_stats, "Fetch broker consume stats data",
                           [(("-b", "--brokerAddr"), dict(required=True, help="broker address")),
                            (("-t", "--timeoutMillis"), dict(type=_nonneg, default=50000, help="request timeout ms")),
                            (("-l", "--level"), dict(type=_nonneg, default=0, help="only rows with diff >= this (0)")),
                            (("-o", "--order"), dict(type=_bool, default=False, help="order topic (false)"))], []),
    "statsAll": (stats_all, "Topic and consumer tps stats (last minute) and messages in the last day",
                 [(("-a", "--activeTopic"), dict(action="store_true", help="only topics with traffic today")),
                  (("-t", "--topic"), dict(help="only this topic"))], []),
    "sendMessage": (send_message, "Send a message",
                    [(("-t", "--topic"), dict(required=True, help="topic name")),
                     (("-p", "--body"), dict(required=True, help="UTF-8 body")),
                     (("-k", "--keys"), dict(help="message keys")),
                     (("-c", "--tags"), dict(help="message tags")),
                     (("-b", "--brokerName"), dict(help="send to this broker (with -i)")),
                     (("-i", "--qid"), dict(type=_nonneg, help="send to this queue (with -b)"))], []),
    "consumeMessage": (consume_message, "Consume (pull, print) messages without committing offsets",
                       [(("-t", "--topic"), dict(required=True, help="topic name")),
                        (("-b", "--brokerName"), dict(help="only this broker")),
                        (("-i", "--queueId"), dict(type=_nonneg, help="only this queue")),
                        (("-o", "--offset"), dict(type=_nonneg, help="start at this queue offset")),
                        (("-g", "--consumerGroup"), dict(help="group to pull as (TOOLS_CONSUMER)")),
                        (("-s", "--beginTimestamp"), dict(type=_timestamp, help="ms or yyyy-MM-dd#HH:mm:ss:SSS")),
                        (("-e", "--endTimestamp"), dict(type=_timestamp, help="ms or yyyy-MM-dd#HH:mm:ss:SSS")),
                        (("-c", "--messageNumber"), dict(type=_nonneg, default=128, help="most messages (128)"))],
                       []),
    "clusterRT": (cluster_rt, "List all clusters' message send round trip times",
                  [(("-a", "--amount"), dict(type=_nonneg, default=100, help="messages per broker a round (100)")),
                   (("-s", "--size"), dict(type=_nonneg, default=128, help="body bytes (128)")),
                   (("-c", "--clusterName"), dict(help="only this cluster")),
                   (("-i", "--interval"), dict(type=_nonneg, default=0,
                                               help="repeat every N seconds until interrupted (0: once)"))], []),
    "leadershipTransfer": (leadership_transfer, "DLedger mode: hand the leadership of a group to a member",
                           [(("-b", "--brokerName"), dict(required=True, help="broker name (the DLedger group's brokers)")),
                            (("-t", "--transfereeId"), dict(required=True, help="the member to lead, e.g. n1")),
                            (("-w", "--waitSeconds"), dict(type=float, default=10.0,
                                                           help="how long to wait for it to lead (10)"))], []),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="RocketMQ admin tool (subset of the Java mqadmin).",
                     epilog="Run 'mqadmin <command> -h' for a command's options.")
    sub = parser.add_subparsers(dest="command", metavar="<command>", parser_class=_Parser)
    for name, (fn, help_text, options, groups) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("-n", "--namesrvAddr", default=os.environ.get("NAMESRV_ADDR"),
                       help="name server address list, e.g. 127.0.0.1:9876;127.0.0.2:9876 (default $NAMESRV_ADDR)")
        for flags, kwargs in options:
            p.add_argument(*flags, **kwargs)
        for group in groups:
            g = p.add_mutually_exclusive_group(required=True)
            for flags, kwargs in group:
                g.add_argument(*flags, **kwargs)
        p.set_defaults(func=fn)
    return parser


def tools_credentials():
    """The account mqadmin signs with on an ACL broker: `$ROCKETMQ_HOME/conf/tools.yml`
    (accessKey, secretKey), as RocketMQ's tools read it; None (unsigned) without one."""
    from mq.acl.sign import load_tools_yml
    home = os.environ.get("ROCKETMQ_HOME") or os.getcwd()
    return load_tools_yml(os.path.join(home, "conf", "tools.yml"))


async def _run(args) -> int:
    admin = AdminClient(args.namesrvAddr, credentials=tools_credentials())
    try:
        # clusterRT -i repeats until interrupted, as RocketMQ's does
        forever = args.command == "clusterRT" and getattr(args, "interval", 0)
        return await mq_loop.wait_for(args.func(admin, args), None if forever else COMMAND_TIMEOUT_S)
    finally:
        await admin.close()


def _reader_gone() -> int:
    """stdout's reader went away (`mqadmin ... | head`): it had all it wanted.  As RocketMQ's
    mqadmin (Java's System.out swallows the error) say nothing and exit 0; stdout now points at
    /dev/null so the interpreter's last flush has nowhere to fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except OSError:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    if not args.namesrvAddr:
        print(f"{PROG} {args.command}: error: no name server: give -n host:port or set NAMESRV_ADDR",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(levelname)s %(name)s: %(message)s")
    try:
        rc = mq_loop.run(_run(args))
        sys.stdout.flush()              # here, where a reader that left is handled below
        return rc
    except BrokenPipeError:
        return _reader_gone()
    except UsageError as e:
        print(f"{PROG} {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (MQClientError, RemotingError) as e:
        print(f"{PROG} {args.command}: error: {e}", file=sys.stderr)
    except asyncio.TimeoutError:
        print(f"{PROG} {args.command}: error: no answer within {COMMAND_TIMEOUT_S:.0f}s", file=sys.stderr)
    except (ValueError, OSError) as e:
        print(f"{PROG} {args.command}: error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
