// An empty shared library, built under tcmalloc's and jemalloc's file names: --enable-tcmalloc and
// --enable-jemalloc preload whatever library they find, and the tests must not depend on the machine
// having either. Preloaded, it defines nothing, so glibc's malloc stays in charge.
