# shellcheck shell=sh
# Removes sockets by path, whoever bound them (test fixtures and one-off carriers).
rm -f -- @SOCKETS@
