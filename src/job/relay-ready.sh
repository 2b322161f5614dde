# shellcheck shell=sh
# Prints the first two lines of the relay's ready file (`ready <address per Service group>`, then its
# isolation line); nothing when it is absent. The prelude makes the socket dir before it starts the
# relay, so a node carrier can bind the forwards before the relay has written the line: it waits for it
# up to 3 s (the relay writes it once it listens, within milliseconds).
bh_f=@READY_FILE@
if sleep 0.01 2>/dev/null; then bh_t=0.1 bh_n=30; else bh_t=1 bh_n=3; fi
while [ "$bh_n" -gt 0 ] && ! grep -q '^ready ' "$bh_f" 2>/dev/null; do sleep "$bh_t"; bh_n=$((bh_n - 1)); done
head -n 2 -- "$bh_f" 2>/dev/null
