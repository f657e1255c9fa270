# shellcheck shell=bash disable=SC2034 # (DEB is for the scripts that source this file)
# The cache of Debian packages the lab images are made of (build/cache/debs, or $PLX_DEB_CACHE):
# sourced by scripts/xen-lab.sh and scripts/golden-image.sh, never run. They set CACHE, DEB_WHO
# (the name their messages start with) and die_fetch (exit 3) before using it.
#
#   deb_fetch PKG...    set DEB[PKG] to the cached .deb of each PACKAGE, downloading apt's
#                       candidate of those absent, all in one `apt-get download`; with no
#                       package lists or no network, any cached version; die_fetch when a
#                       package is neither downloadable nor cached
#   deb_candidates PKG... fill DEB_CAND[PKG] with apt's candidate versions (one apt-cache call),
#                       but for a package whose version the caller has set there already (a pin)
#
# One fetcher at a time holds the cache's lock (CACHE/.lock) while it looks and downloads: make
# check fetches the packages in the background while it builds and runs the unit tests, and a lab
# script that starts before it has finished waits for it, then finds them cached (or, if that
# fetch failed, downloads what is missing itself). A download goes to a directory of its own in
# the cache and only whole .deb files are renamed into it, so a download cut short leaves
# nothing a later run would take for a package.

declare -A DEB_CAND=() DEB=()

deb_candidates() {
    local line pkg="" ask=()
    for pkg in "$@"; do [[ -n ${DEB_CAND[$pkg]:-} ]] || ask+=("$pkg"); done
    [[ ${#ask[@]} -gt 0 ]] || return 0
    pkg=""
    while IFS= read -r line; do
        case $line in
        [a-z0-9]*:) pkg=${line%:} ;;
        *Candidate:*) [[ -z $pkg ]] || DEB_CAND[$pkg]=${line##*Candidate: } ;;
        esac
    done < <(apt-cache policy "${ask[@]}" 2>/dev/null || true)
}

# _deb_file PKG: the cache's file of apt's candidate of PKG (whether it exists or not); empty
# when apt knows no candidate.
_deb_file() {
    local ver=${DEB_CAND[$1]:-}
    [[ -n $ver && $ver != "(none)" ]] || return 0
    # .deb names spell the epoch's ':' as %3a.
    echo "$CACHE/${1}_${ver//:/%3a}_amd64.deb"
}

# _deb_download PKG=VER...: apt-get download into a directory of its own, then the whole files
# into the cache. apt-get writes as the _apt user where it can; a root-owned directory makes it
# warn and download as root instead, which is fine: only that warning is silenced.
_deb_download() {
    local tmp
    tmp=$(mktemp -d "$CACHE/.download.XXXXXX")
    (cd "$tmp" && apt-get download -q "$@" 2>&1 | grep -v unsandboxed >&2) || true
    find "$tmp" -maxdepth 1 -name '*.deb' -size +0 -exec mv -f {} "$CACHE/" \;
    rm -rf "$tmp"
}

deb_fetch() {
    local pkg file deb want=() fd
    mkdir -p "$CACHE"
    exec {fd}>"$CACHE/.lock"
    flock "$fd"
    # (A download directory left by a fetch that was killed: nobody else downloads now.)
    rm -rf "$CACHE"/.download.*
    deb_candidates "$@"
    for pkg in "$@"; do
        file=$(_deb_file "$pkg")
        [[ -z $file || -s $file ]] || want+=("$pkg=${DEB_CAND[$pkg]}")
    done
    if [[ ${#want[@]} -gt 0 ]]; then
        echo "$DEB_WHO: downloading ${#want[@]} packages: ${want[*]%%=*}" >&2
        # (Each is apt's candidate, so apt knows every version asked for: what can fail is the
        # mirror, which asking again at once would not mend.)
        _deb_download "${want[@]}"
    fi
    exec {fd}>&-
    for pkg in "$@"; do
        file=$(_deb_file "$pkg")
        if [[ -n $file && -s $file ]]; then
            DEB[$pkg]=$file
            continue
        fi
        deb=$(find "$CACHE" -maxdepth 1 -name "${pkg}_*_amd64.deb" | LC_ALL=C sort | tail -1)
        [[ -n $deb ]] || die_fetch "cannot get $pkg: not in $CACHE and apt-get download failed" \
            "(is the Debian mirror reachable? run apt-get update)"
        echo "$DEB_WHO: using cached $(basename "$deb")" >&2
        DEB[$pkg]=$deb
    done
}
