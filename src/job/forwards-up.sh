# shellcheck shell=sh
# Once the forwards are bound, one script instead of two (each exec is 3 round trips to the node, over a
# WAN 60 ms and more): socket-inodes.sh before this line, relay-ready.sh after it.
echo @RELAY_PART@
