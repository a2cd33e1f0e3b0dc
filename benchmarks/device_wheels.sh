# Sourced by the scripts that prepare a lent GPU machine's runs (gpu_wheels.sh, main_command_wheels.sh).
# download_device_wheels DIR NAME==VERSION...: the binary wheels of those exact versions for the machine's
# Python 3.12 on x86-64 Linux, without their dependencies (each script names every one its image lacks).
download_device_wheels() {
  local dir=$1
  shift
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$dir" "$@"
}
