#!/usr/bin/env bash
# lockd_hosts.sh on a tgtd LUN: several hosts (engine processes with their own host ids,
# initiator names and reservation keys) on one iSCSI LUN under a byte model, a VDI handed
# between them a hundred times with every connection dropped by the target halfway, a host
# killed -9 (its key preempted by the host that takes its VDI), a host frozen past its lease,
# lockd killed -9 and restarted; parallax check clean and nothing flushed lost at the end.
export PLX_LOCKD_ON_ISCSI=1
# shellcheck source=tests/integration/lockd_hosts.sh
. "$(dirname "$0")/lockd_hosts.sh"
