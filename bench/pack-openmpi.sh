#!/usr/bin/env bash
# Packs this machine's Debian Open MPI (openmpi-bin, its libraries, PMIx, hwloc, libevent and
# every shared library they load that glibc does not provide) into a relocatable tree, for a
# machine that has no Open MPI and no package registry (the GPU machines), so that Open MPI runs
# there side by side with occl on idle CPUs.
#
#   bash bench/pack-openmpi.sh DIR        # then, on the other machine:
#   source DIR/env.sh                     # sets PATH, LD_LIBRARY_PATH, OPAL_PREFIX, PMIX_PREFIX
#
# Open MPI finds its plugins, help files and orted relative to OPAL_PREFIX; PMIx likewise
# relative to PMIX_PREFIX. Compile MPI programs here (mpicc) and carry the binaries.
set -euo pipefail
out=${1:?usage: pack-openmpi.sh DIR}
command -v mpirun >/dev/null || { echo "pack-openmpi: no Open MPI here (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 1; }
rm -rf "$out" && mkdir -p "$out/root" "$out/extra"
pkgs=$(dpkg-query -W -f '${Package}\n' 'openmpi-bin' 'openmpi-common' 'libopenmpi3*' 'libpmix2*' 'libhwloc15*' 'libevent-*2.1-7*')
for p in $pkgs; do
  dpkg -L "$p" | while read -r f; do
    [[ -f $f && $f != /usr/share/doc/* && $f != /usr/share/man/* ]] || continue
    mkdir -p "$out/root$(dirname "$f")" && cp -a "$f" "$out/root$f"
    # dpkg lists symlinks' targets only as files of their own; keep links as links.
  done
done
# Symlinks of the libraries (libmpi.so.40 -> libmpi.so.40.30.4) and the alternatives' targets.
for p in $pkgs; do
  dpkg -L "$p" | while read -r f; do
    [[ -L $f ]] || continue
    mkdir -p "$out/root$(dirname "$f")" && cp -a "$f" "$out/root$f"
  done
done
# Libraries the binaries and plugins load that the packages above do not hold (libnuma, libfabric,
# libucx, libibverbs ...); glibc's own are left to the target machine.
find "$out/root" -type f \( -name '*.so*' -o -perm -u+x \) -print0 |
  { xargs -0 ldd 2>/dev/null || true; } | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
    case $(basename "$lib") in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libresolv.so*|libutil.so*) continue ;;
    esac
    [[ -e "$out/root$lib" ]] || cp -L "$lib" "$out/extra/"
  done
# Debian reaches mpirun through update-alternatives, which the tree has not.
ln -sf orterun "$out/root/usr/bin/mpirun"
cat > "$out/env.sh" <<'ENV'
# source this file: Open MPI from this tree
_r=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX=$_r/root/usr PMIX_PREFIX=$_r/root/usr PMIX_INSTALL_PREFIX=$_r/root/usr
export PATH=$_r/root/usr/bin:$PATH
export LD_LIBRARY_PATH=$_r/root/usr/lib/x86_64-linux-gnu:$_r/root/usr/lib/x86_64-linux-gnu/openmpi/lib:$_r/extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Plugins this tree cannot serve (InfiniBand, UCX, OFI) are not loaded: shared memory and TCP only.
export OMPI_MCA_pml=ob1 OMPI_MCA_mtl=^ofi,psm,psm2 OMPI_MCA_btl_openib_warn_no_device_params_found=0 OMPI_MCA_osc=^ucx
ENV
du -sh "$out"
