"""Master/slave replication of the CommitLog, RocketMQ 4.x style (spec section 4).

    master store --HAMaster (mq.ha.master)--TCP haListenPort--HASlave (mq.ha.slave)--> slave store
                  reader: 8-byte reports         <-----  first = start offset, then acks
                  writer: header 12 + raw bytes  ----->  received into the mapped log, validated, published

The bytes on the wire are the master's CommitLog bytes, and the slave appends
them at the same offsets: the two logs are byte-identical (mq.wire.ha declares
the frames; the C transport sends with sendfile and receives straight into
the mapped file).  The slave's own dispatch builds its ConsumeQueues.

Invariants:
  * POS_ACKED (what SYNC_MASTER senders wait on) only moves on an ack that is
    <= what the master has sent on that connection; a bogus ack closes the
    connection and changes nothing.
  * The slave publishes a record only after checking it (magic, size, CRC,
    physical offset); corrupt input ends the connection, never the log.
  * A slave holding more than the master (the master lost a tail) is cut back
    to the master's end, loudly, with the byte count (mq.ha.truncate).

Files in the store root: ha-status.json (the master's slaves, for the io
workers), ha-master.txt (the slave's master address, from the supervisor).
The role runs as a process of its own: mq.ha.role.start_ha_process."""
from .common import MASTER_ADDR_FILE, STATUS_FILE
from .master import HAMaster
from .role import ha_role_main, read_master_addr, start_ha_process
from .slave import HASlave
from .truncate import DispatchBusy, TruncateReport, rebase_empty, truncate_to

__all__ = ["HAMaster", "HASlave", "truncate_to", "rebase_empty", "TruncateReport", "DispatchBusy",
           "ha_role_main", "start_ha_process", "read_master_addr", "STATUS_FILE", "MASTER_ADDR_FILE"]
