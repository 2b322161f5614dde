#!/bin/sh
# backhaul carrier bootstrap: prepares a user-space sshd in the job's socket dir (render/userspace-sshd.ts).
# Fed to `/bin/sh -s`, so the commands that might read stdin (ssh-keygen asks questions) read /dev/null:
# they would eat the rest of the script. Prints one line, `backhaul-hostkey <type> <base64>`, on
# success; a failure prints one `backhaul-bootstrap: ...` line on stderr and exits with its status.
umask 077
bh_fail() {
  printf 'backhaul-bootstrap: %s\n' "$2" >&2
  exit "$1"
}
bh_dir=@DIR@
bh_carrier=@CARRIER@
bh_key=@HOST_KEY@
bh_pub=@HOST_PUBLIC_KEY@
bh_auth=@AUTHORIZED_KEYS@
bh_cfg=@CONFIG_FILE@
bh_sshd=@SSHD@
bh_keygen=@KEYGEN@

# The prelude made the dir 0700 for the job's user; anything else is not the job's dir.
if [ ! -e "$bh_dir" ] && [ ! -L "$bh_dir" ]; then
  bh_fail @DIR_MISSING@ "socket dir $bh_dir missing: job not started or prelude not run"
fi
if [ -L "$bh_dir" ] || [ ! -d "$bh_dir" ]; then
  bh_fail @DIR_NOT_DIRECTORY@ "socket dir $bh_dir is not a directory"
fi
if [ ! -O "$bh_dir" ]; then
  bh_fail @DIR_NOT_OWNED@ "socket dir $bh_dir is not owned by $(id -un)"
fi
case $(ls -ld -- "$bh_dir") in
  drwx------*) ;;
  *) bh_fail @DIR_BAD_MODE@ "socket dir $bh_dir does not have mode 0700" ;;
esac
if [ -L "$bh_carrier" ]; then
  bh_fail @CARRIER_DIR@ "$bh_carrier is a symbolic link"
fi
if [ ! -d "$bh_carrier" ] && ! mkdir -m 700 "$bh_carrier"; then
  bh_fail @CARRIER_DIR@ "cannot create $bh_carrier"
fi
if ! chmod 700 "$bh_carrier"; then
  bh_fail @CARRIER_DIR@ "cannot make $bh_carrier private"
fi

# A fresh host key per attempt: the session host pins it for this one connection. ssh-keygen would ask
# before overwriting, so the old one goes first.
rm -f -- "$bh_key" "$bh_pub"
if ! "$bh_keygen" -q -t ed25519 -N '' -C backhaul-carrier -f "$bh_key" </dev/null >/dev/null; then
  bh_fail @HOST_KEY_FAILED@ "cannot generate a host key with $bh_keygen"
fi
if ! {
  printf '%s\n' @AUTHORIZED_LINE@ >"$bh_auth" &&
  printf '%s' @SSHD_CONFIG@ >"$bh_cfg"
}; then
  bh_fail @WRITE_FILES@ "cannot write the files in $bh_carrier"
fi
if ! "$bh_sshd" -t -f "$bh_cfg" </dev/null >&2; then
  bh_fail @SSHD_CONFIG_REFUSED@ "$bh_sshd refuses the configuration $bh_cfg"
fi
if ! read -r bh_type bh_blob _ <"$bh_pub" || [ -z "$bh_blob" ]; then
  bh_fail @HOST_KEY_FAILED@ "cannot read the host key $bh_pub"
fi
printf '%s %s %s\n' @HOSTKEY_PREFIX@ "$bh_type" "$bh_blob"
exit 0
