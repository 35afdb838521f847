/* fuzz_util.h - the fuzz input as a file: targets whose code under test opens
 * a path (the converter's set-up, the engine) get an anonymous memfd and its
 * /proc/self/fd name. */
#ifndef JLM_FUZZ_UTIL_H
#define JLM_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

/* Writes data to a fresh memfd; its path into path. fd, or -1. */
static int fuzz_as_file(const uint8_t *data, size_t size, char *path, size_t path_len)
{
    int fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)w;
    }
    snprintf(path, path_len, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
