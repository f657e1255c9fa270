#!/usr/bin/env bash
# plx-test: alone (asserts that no write waits 1 s: another script beside it could cause that)
# lockd_outage_claims.sh on a tgtd LUN, as a pool runs (issue 30): with lockd frozen, a VDI that
# needs new extents and snapshots waits alone, and the other VDIs of the server are served.
exec bash "$(dirname "$0")/lockd_outage_claims.sh" --iscsi
