# Sourced by the bench scripts: `need PROGRAM DEBIAN-PACKAGE` installs the
# package when the program is missing and apt-get is there, or fails saying
# which package to install.
need() {
  command -v "$1" >/dev/null && return
  if command -v apt-get >/dev/null; then
    (apt-get install -y "$2" >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y "$2" >/dev/null; })
  fi
  command -v "$1" >/dev/null || { echo "bench: $1 is missing (Debian package $2)" >&2; return 1; }
}
