# shellcheck shell=bash
#
# parallax-hotplug-common.sh - shared by the Parallax block hotplug scripts (block-parallax,
# block-parallax-tap). Install it beside them in /etc/xen/scripts.
#
# Like Xen's own block scripts it sources Xen's block-common.sh (which sources
# xen-hotplug-common.sh: logging, fatal, success, xenstore_read/_write, write_dev, and an ERR
# trap). Where those files are absent (a custom install, or the tests), it defines the few
# helpers the scripts use itself, with the same behaviour.
#
# The caller sets `dir` (the script's directory) and sources this file with its own arguments
# in "$@", as Xen's scripts do with block-common.sh.
#
# The same scripts run in dom0 and in a storage driver domain (docs/storage-vm.md), where
# `xl devd` runs them: libxl gives XENBUS_PATH relative ("backend/vbd/<guest>/<devid>"), which
# xenstore resolves under the calling domain's own /local/domain/<domid>, so the scripts only
# ever use paths below $XENBUS_PATH and never name a domain.
#
# Environment (all optional; libxl runs hotplug scripts with a minimal environment, so in
# production the defaults apply):
#   PARALLAX_BLOCKSTORE        this host's blockstore (a file or device path, or an iSCSI LUN
#                              as iscsi://[user%password@]host[:port]/target-iqn/lun); else the
#   PARALLAX_BLOCKSTORE_FILE   first line of this file that is neither empty nor a # comment
#                              (default /etc/parallax/blockstore; keep it mode 600 when it holds
#                              a password)
#   PARALLAX_RUNDIR            state: lock, NBD socket, server pid (default /run/parallax)

: "${dir:=$(dirname "$0")}"

if [ -f "$dir/block-common.sh" ]; then
    # shellcheck source=/dev/null
    . "$dir/block-common.sh"
else
    command=${1:-}
    if [ "$command" != add ] && [ "$command" != remove ]; then
        echo "${0##*/}: invalid command '${command}' (expected add or remove)" >&2
        exit 1
    fi
    XENBUS_PATH="${XENBUS_PATH:?is not set: ${0##*/} is a Xen hotplug script, run by libxl}"

    # To syslog; errors (and everything, when syslog is unavailable) also to stderr, which
    # libxl keeps in its log.
    log() {
        local level=$1
        shift
        if ! logger -p "daemon.$level" -t "${0##*/}" -- "$*" 2>/dev/null || [ "$level" = err ]; then
            echo "${0##*/}: $*" >&2
        fi
    }

    # Report the failure where xl shows it (hotplug-error) and stop.
    fatal() {
        xenstore-write "$XENBUS_PATH/hotplug-error" "$*" \
            "$XENBUS_PATH/hotplug-status" error 2>/dev/null || true
        log err "$@"
        exit 1
    }

    success() {
        xenstore_write "$XENBUS_PATH/hotplug-status" connected
    }

    xenstore_read_default() {
        xenstore-read "$1" 2>/dev/null || echo "$2"
    }

    xenstore_write() {
        log debug "Writing $* to xenstore."
        xenstore-write "$@" || fatal "Writing $* to xenstore failed."
    }

    do_or_die() {
        "$@" || fatal "$* failed"
    }

    # The device's major:minor in hex, as blkback wants them.
    device_major_minor() {
        stat -L -c %t:%T "$1"
    }

    write_dev() {
        local mm
        mm=$(device_major_minor "$1" || true)
        [ -n "$mm" ] || fatal "Backend device $1 does not exist"
        xenstore_write "$XENBUS_PATH/physical-device" "$mm"
        xenstore_write "$XENBUS_PATH/physical-device-path" "$1"
        success
    }
fi

plx_rundir=${PARALLAX_RUNDIR:-/run/parallax}
plx_lockfd=9

# Print this host's blockstore, or fail saying where it was looked for.
plx_blockstore() {
    local conf=${PARALLAX_BLOCKSTORE_FILE:-/etc/parallax/blockstore} bs=""
    if [ -n "${PARALLAX_BLOCKSTORE:-}" ]; then
        echo "$PARALLAX_BLOCKSTORE"
        return 0
    fi
    if [ -r "$conf" ]; then
        bs=$(sed -n -e '/^[[:space:]]*#/d' -e '/[^[:space:]]/{s/^[[:space:]]*//;s/[[:space:]]*$//;p;q;}' \
            "$conf" || true)
    fi
    [ -n "$bs" ] || fatal "no Parallax blockstore configured: put its path or iscsi:// URI in $conf"
    echo "$bs"
}

# A blockstore as it may be shown in messages, xenstore (hotplug-error, readable by the
# toolstack) and syslog: an iSCSI URI's password replaced by ***.
plx_redact() {
    local re='^(iscsi://[^/@%]*%)[^@/]*@(.*)$'
    if [[ $1 =~ $re ]]; then
        echo "${BASH_REMATCH[1]}***@${BASH_REMATCH[2]}"
    else
        echo "$1"
    fi
}

# Check a VDI spec (what follows "parallax:"): a VDI name or id, or VDI@N / VDI@LABEL. Names
# contain no '/', spaces or control characters; at most one '@', not at either end.
plx_check_vdi() {
    local vdi=$1 what=$2
    local ctrl='[[:cntrl:][:space:]/]'
    if [ -z "$vdi" ]; then
        fatal "malformed target '$what': no VDI named (expected target=<vdi> or <vdi>@<snapshot>)"
    fi
    if [[ $vdi =~ $ctrl ]]; then
        fatal "malformed target '$what': a VDI name has no '/', spaces or control characters"
    fi
    case $vdi in
    @* | *@ | *@*@*)
        fatal "malformed target '$what': expected <vdi> or <vdi>@<snapshot>"
        ;;
    esac
}

# Serialise the scripts (choosing a free device and starting the server must not race). The
# lock is a descriptor of this shell; commands that leave processes behind (servers, daemons)
# are run with it closed, or they would hold the lock for ever.
plx_lock() {
    mkdir -p "$plx_rundir" || fatal "cannot create $plx_rundir"
    eval "exec $plx_lockfd>>\"\$plx_rundir/hotplug.lock\"" ||
        fatal "cannot open $plx_rundir/hotplug.lock"
    flock -w 60 "$plx_lockfd" || fatal "timed out waiting for $plx_rundir/hotplug.lock"
}

plx_unlock() {
    eval "exec $plx_lockfd>&-"
}

# Run a command with the lock descriptor closed.
plx_nolock() {
    (
        eval "exec $plx_lockfd>&-"
        exec "$@"
    )
}
