"""DLedger mode: a Raft-replicated CommitLog with automatic failover (spec §7).

    core     Raft as a deterministic state machine (roles, pre-vote, check-quorum leases,
             replication, commit, leadership transfer); no clock, socket or file inside
    sim      the same core under a seeded simulator with a faulty network (tests, replay)

Imports point one way: mq.wire <- mq.store <- mq.dledger <- mq.broker."""
