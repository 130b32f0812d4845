#!/bin/sh
# Install the tools the hardware-managers erase tests drive: partitioners, mkfs, LVM and
# util-linux (losetup, wipefs, blkid, mount). Idempotent: only packages whose command is
# missing are installed, so re-running it on a prepared machine (or in CI) is a no-op.
set -eu

# command → Debian package that ships it
need=""
check() {
    if ! command -v "$1" >/dev/null 2>&1 && ! [ -x "/usr/sbin/$1" ] && ! [ -x "/sbin/$1" ]; then
        case " $need " in
            *" $2 "*) ;;
            *) need="$need $2" ;;
        esac
    fi
}
check sgdisk gdisk
check parted parted
check mkfs.ext4 e2fsprogs
check mkfs.xfs xfsprogs
check pvcreate lvm2
check losetup mount
check wipefs util-linux
check blkid util-linux
check mount mount

if [ -z "$need" ]; then
    echo "install-erase-test-tools: everything present"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-erase-test-tools: need root to install:$need" >&2
    exit 1
fi

echo "install-erase-test-tools: installing:$need"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086 # word splitting of the package list is intended
apt-get install -y -qq --no-install-recommends $need
