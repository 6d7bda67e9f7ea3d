/*
 * glibc_compat.h: bind the plugin's glibc references to versions glibc 2.17 has, so the
 * plugin loads on glibc >= 2.17 (Ubuntu 20.04 ships 2.31, RHEL/CentOS 7 2.17) whatever
 * glibc builds it. Included first in every source of the shipped library (Makefile
 * -include); `make -C native check-glibc` (part of `make test`) fails if the built library
 * asks for any GLIBC_x.y above 2.17.
 *
 * Why: glibc 2.34 moved libpthread and libdl into libc and gave the moved functions new
 * default versions (pthread_create@@GLIBC_2.34, dlsym@@GLIBC_2.34, ...); 2.32 did the same
 * for pthread_sigmask. Older glibcs lack those versions, so the dynamic loader refuses the
 * library and NCCL runs without it, silently. The old versions are still exported by new
 * glibcs (compat symbols, same behaviour), and glibc's symbol lookup matches a version by
 * name, not by library, so on an old system the reference finds the same function in
 * libpthread.so.0 / libdl.so.2 (linked as DT_NEEDED for that reason).
 *
 * Not used for the sanitizer builds: their runtimes intercept these functions by name.
 */
#ifndef COLLSCOPE_GLIBC_COMPAT_H
#define COLLSCOPE_GLIBC_COMPAT_H

#if defined(__linux__) && !defined(__ANDROID__)
#if defined(__x86_64__)
#define CS_GLIBC_BASE "GLIBC_2.2.5"
#define CS_GLIBC_SETCLOCK "GLIBC_2.3.3"
#elif defined(__aarch64__)
#define CS_GLIBC_BASE "GLIBC_2.17"      /* the first glibc of aarch64 */
#define CS_GLIBC_SETCLOCK "GLIBC_2.17"
#endif
#endif

#ifdef CS_GLIBC_BASE
__asm__(".symver pthread_create,pthread_create@" CS_GLIBC_BASE);
__asm__(".symver pthread_join,pthread_join@" CS_GLIBC_BASE);
__asm__(".symver pthread_sigmask,pthread_sigmask@" CS_GLIBC_BASE);
__asm__(".symver pthread_condattr_setclock,pthread_condattr_setclock@" CS_GLIBC_SETCLOCK);
__asm__(".symver dlopen,dlopen@" CS_GLIBC_BASE);
__asm__(".symver dlsym,dlsym@" CS_GLIBC_BASE);
__asm__(".symver dlclose,dlclose@" CS_GLIBC_BASE);
__asm__(".symver dlerror,dlerror@" CS_GLIBC_BASE);
#endif

#endif /* COLLSCOPE_GLIBC_COMPAT_H */
