#!/usr/bin/env bash
# xen_hotplug_serve.sh with this host's blockstore on an iSCSI LUN (tgtd on loopback): the
# hotplug script reads the iscsi:// URL from /etc/parallax/blockstore and starts the real
# `parallax serve` on it.
PLX_HOTPLUG_ISCSI=1 exec bash "$(dirname "$0")/xen_hotplug_serve.sh"
