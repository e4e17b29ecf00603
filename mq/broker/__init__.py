"""The broker (`mqbroker`): a supervisor and the role processes it starts.

    supervisor (mq.broker.supervisor)  store owner, metadata, registration, restarts
    +-- launcher (mq.broker.launcher)  single-threaded; forks every role process below
        +-- io worker x N (mq.broker.worker)   send and pull roles, SO_REUSEPORT
        +-- flush, dispatch (mq.store.roles), ha (mq.ha.role)

Imports point one way: mq.wire <- mq.store <- mq.ha <- mq.broker."""
