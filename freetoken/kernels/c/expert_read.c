/* One expert's read from the model file into its host-cache slot in one C call (experts/disk/
 * c_reads.py): each piece's aligned O_DIRECT span straight into the slot's frame, the piece's bytes
 * hashed as they landed (xxh3, through the caller's update function: the checksums' digests), then
 * narrower ggml rows spread out to the bank's pitch in place. The same bytes, hash and errors as
 * host_cache.ExpertReader's Python path, whose per-piece Python (memoryviews, ctypes addresses,
 * the spread's numpy temporary) was ~0.1-0.2 ms of a reader's CPU a read, with the GIL held, on
 * a 2-core box where the decode thread waits for it (issue 39). */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

typedef int (*ft_hash_update_fn)(void *state, const void *data, size_t len);

/* Whole blocks from `start` into `dst` until `span` bytes or the file ends (an O_DIRECT count
 * short of a 512-byte block is the end, as direct.read_span). Returns the bytes read, or -errno. */
static int64_t read_span(int fd, uint8_t *dst, int64_t span, int64_t start) {
    int64_t got = 0;
    while (got < span) {
        ssize_t k = pread(fd, dst + got, (size_t)(span - got), (off_t)(start + got));
        if (k < 0) {
            if (errno == EINTR) continue;
            return -(int64_t)errno;
        }
        got += k;
        if (k == 0 || k % 512) break;
    }
    return got;
}

/* Rows of `rb` bytes packed at `p` moved out to `pitch` apart, the padding zeroed: last row first,
 * so a row never lands on one not yet moved (every destination is at or past its source). */
static void spread_rows(uint8_t *p, int64_t rows, int64_t rb, int64_t pitch) {
    for (int64_t r = rows - 1; r >= 0; r--) {
        memmove(p + r * pitch, p + r * rb, (size_t)rb);
        memset(p + r * pitch + rb, 0, (size_t)(pitch - rb));
    }
}

/* Pieces i < n of one expert: fds[i] (< 0: the piece is not this expert's, skipped), file offset
 * off[i], nbytes[i]; the piece lands at dst[i] + slot * stride[i] (its frame's place for it), its
 * aligned span (alignment `align`) reaching `off % align` bytes before it. rows[i] > 0 with
 * pitch[i] > 0: ggml rows of nbytes/rows bytes spread out to `pitch`. hash (NULL: none):
 * update(state, piece, nbytes) per piece, in order, before the spread. got[i]: the piece's bytes
 * read. Returns n when every piece is whole, the index of the first short piece (the file ended),
 * or -errno where a read failed. */
int64_t ft_read_expert(int64_t n, const int64_t *fds, const int64_t *off, const int64_t *nbytes,
                       const int64_t *dst, const int64_t *stride, int64_t slot, int64_t align,
                       const int64_t *rows, const int64_t *pitch, void *hash, void *state, int64_t *got) {
    ft_hash_update_fn update = (ft_hash_update_fn)hash;
    for (int64_t i = 0; i < n; i++) {
        got[i] = 0;
        if (fds[i] < 0) continue;
        const int64_t head = off[i] % align;
        const int64_t span = (head + nbytes[i] + align - 1) / align * align;
        uint8_t *piece = (uint8_t *)(intptr_t)(dst[i] + slot * stride[i]);
        const int64_t r = read_span((int)fds[i], piece - head, span, off[i] - head);
        if (r < 0) return r;
        const int64_t mine = r - head < 0 ? 0 : (r - head < nbytes[i] ? r - head : nbytes[i]);
        got[i] = mine;
        if (mine < nbytes[i]) return i;
        if (update) update(state, piece, (size_t)nbytes[i]);
        if (rows[i] > 0 && pitch[i] > 0) spread_rows(piece, rows[i], nbytes[i] / rows[i], pitch[i]);
    }
    return n;
}
