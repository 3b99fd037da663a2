#!/bin/sh
# prerm of the kmirror package: stop the member before its files go (a
# clean shutdown: it hands its partitions to the other members).
set -e
if [ -z "$DPKG_ROOT" ] && [ -d /run/systemd/system ] && [ "$1" = remove ]; then
	systemctl stop kmirror.service || true
fi
