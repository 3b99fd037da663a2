#!/bin/sh
# postinst of the kmirror package: the kmirror user and its folders, then
# systemd told about the unit (not started: /etc/kmirror/kmirror.yaml must
# be written first, see /usr/share/kmirror/kmirror.example.yaml).
# DPKG_ROOT is set when dpkg installs into another root
# (--root with --force-script-chrootless): everything goes there.
set -e
if [ "$1" = configure ]; then
	if command -v systemd-sysusers >/dev/null 2>&1; then
		systemd-sysusers ${DPKG_ROOT:+--root="$DPKG_ROOT"} kmirror.conf
	elif ! getent passwd kmirror >/dev/null 2>&1; then
		useradd ${DPKG_ROOT:+--root "$DPKG_ROOT"} --system --home-dir /var/lib/kmirror --shell /usr/sbin/nologin --user-group kmirror
	fi
	if command -v systemd-tmpfiles >/dev/null 2>&1; then
		systemd-tmpfiles ${DPKG_ROOT:+--root="$DPKG_ROOT"} --create kmirror.conf
	fi
	if [ -z "$DPKG_ROOT" ] && [ -d /run/systemd/system ]; then
		systemctl daemon-reload || true
	fi
fi
