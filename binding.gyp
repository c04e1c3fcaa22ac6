{
  "targets": [
    {
      "target_name": "warren_native",
      "sources": [
        "native/helper/src/addon.cc",
        "native/helper/src/util.c",
        "native/helper/src/cgroup.c",
        "native/helper/src/spawn.c",
        "native/helper/src/mnt_template.c",
        "native/helper/src/nsexec.c",
        "native/helper/src/rootfs.c",
        "native/helper/src/misc.c",
        "native/helper/src/clone.c",
        "native/helper/src/confine.c",
        "native/helper/src/seccomp.c",
        "native/helper/src/bpf_egress.c",
        "native/helper/src/prefetch.c"
      ],
      "include_dirs": [
        "<!(node -p \"require('node-addon-api').include_dir\")",
        "native/helper/src"
      ],
      "defines": [
        "NAPI_VERSION=8",
        "NAPI_CPP_EXCEPTIONS",
        "NODE_ADDON_API_DISABLE_DEPRECATED",
        "_GNU_SOURCE"
      ],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions", "-fno-rtti", "-std=gnu++17", "-std=gnu++20"],
      "cflags": [
        "-fvisibility=hidden",
        "-fstack-protector-strong",
        "-Wall",
        "-Wextra",
        "-Wno-unused-parameter",
        "-Wno-missing-field-initializers"
      ],
      "cflags_c": ["-std=gnu11", "-Werror=implicit-function-declaration"],
      "cflags_cc": ["-std=c++17", "-fexceptions"],
      "ldflags": ["-Wl,-z,relro,-z,now", "-Wl,-z,noexecstack"],
      "libraries": ["-lbpf"]
    }
  ]
}
