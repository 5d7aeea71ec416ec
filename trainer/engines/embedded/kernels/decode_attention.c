/* Decode attention for the embedded engine on CPU: one new query token per row, each KV head's query group read
 * against that row's cached keys and values in one pass (online softmax, fp32 accumulation).
 *
 * Why it exists: ATen's CPU flash-attention kernel spends most of a decode step's attention on per-(row, head)
 * set-up: with 3 queries per KV head and a few hundred keys, its bf16 time equals its fp32 time although it reads
 * half the bytes. This kernel does the same arithmetic with AVX-512 registers and no per-call allocation.
 * Python side, build and figures: decode_attention.py beside this directory.
 *
 * Layouts (strides in elements; the innermost dimension, head_dim, is contiguous everywhere):
 *   q      [rows, kv_heads, group, head_dim]   strides q_row, q_head, q_group
 *   keys   [slots, kv_heads, capacity, head_dim] (one layer of the KV cache), strides kv_slot, kv_head, head_dim
 *   values the same layout and strides as keys
 *   lengths[rows]: keys 0..lengths[r]-1 of slot r are attended (the decode token's own key included)
 *   out    [rows, kv_heads, group, head_dim], contiguous
 * dtype: 0 = float32, 1 = bfloat16 (q, keys, values and out alike).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define BLOCK 32        /* keys per online-softmax block: two vectors of scores per query */
#define MAX_GROUP 16    /* queries per KV head */
#define MAX_DIM 256     /* head_dim, a multiple of 16 */

int envhub_decode_attention_abi(void) { return 1; }

#ifdef __AVX512F__

static inline __m512 load16(const void *p, const int bf16) {
    if (bf16) {
        __m256i half = _mm256_loadu_si256((const __m256i *)p);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
    }
    return _mm512_loadu_ps((const float *)p);
}

static inline void store16(void *p, __m512 x, const int bf16) {
    if (bf16) { /* round to nearest even, as torch's float -> bfloat16 conversion (finite inputs) */
        __m512i bits = _mm512_castps_si512(x);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
        bits = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
        _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
    } else {
        _mm512_storeu_ps((float *)p, x);
    }
}

/* e^x for x <= 0: 2^(x log2 e) split into 2^n 2^f, |f| <= 1/2, 2^f by its Taylor series to degree 7 (relative error
 * under 1e-8 on that interval); inputs below -87 give 0 after scaling. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-100.0f));
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147180559945309f)); /* f ln 2 */
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* One (row, KV head): `group` queries against `length` keys. Inlined into callers that pass constant `group` and
 * `dim` for the common shapes, so that the accumulators and queries live in registers. */
static inline __attribute__((always_inline)) void attend(const char *q, int64_t q_group, const char *k, const char *v,
                                                         int64_t length, char *out, const int group, const int dim,
                                                         float scale, const int bf16) {
    const int size = bf16 ? 2 : 4, chunks = dim / 16;
    float query[MAX_GROUP][MAX_DIM] __attribute__((aligned(64)));
    float acc[MAX_GROUP][MAX_DIM] __attribute__((aligned(64)));
    float scores[MAX_GROUP][BLOCK] __attribute__((aligned(64)));
    float running_max[MAX_GROUP], running_sum[MAX_GROUP];
    for (int g = 0; g < group; g++) {
        for (int c = 0; c < chunks; c++) {
            __m512 x = _mm512_mul_ps(load16(q + (g * q_group + c * 16) * size, bf16), _mm512_set1_ps(scale));
            _mm512_store_ps(&query[g][c * 16], x);
            _mm512_store_ps(&acc[g][c * 16], _mm512_setzero_ps());
        }
        running_max[g] = -INFINITY;
        running_sum[g] = 0.0f;
    }
    const int64_t row_bytes = (int64_t)dim * size;
    for (int64_t start = 0; start < length; start += BLOCK) {
        const int count = (int)(length - start < BLOCK ? length - start : BLOCK);
        /* scores = query . key, one key row loaded once for the whole group */
        for (int j = 0; j < count; j++) {
            const char *key = k + (start + j) * row_bytes;
            __m512 sums[MAX_GROUP];
            for (int g = 0; g < group; g++) sums[g] = _mm512_setzero_ps();
            for (int c = 0; c < chunks; c++) {
                __m512 kc = load16(key + c * 16 * size, bf16);
                for (int g = 0; g < group; g++) sums[g] = _mm512_fmadd_ps(_mm512_load_ps(&query[g][c * 16]), kc, sums[g]);
            }
            for (int g = 0; g < group; g++) scores[g][j] = _mm512_reduce_add_ps(sums[g]);
        }
        const __mmask16 low = count >= 16 ? 0xffff : (__mmask16)((1u << count) - 1);
        const __mmask16 high = count <= 16 ? 0 : (count >= 32 ? 0xffff : (__mmask16)((1u << (count - 16)) - 1));
        float probs[MAX_GROUP][BLOCK] __attribute__((aligned(64)));
        for (int g = 0; g < group; g++) {
            const __m512 ninf = _mm512_set1_ps(-INFINITY);
            __m512 s0 = _mm512_mask_load_ps(ninf, low, &scores[g][0]);
            __m512 s1 = _mm512_mask_load_ps(ninf, high, &scores[g][16]);
            float block_max = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
            float new_max = block_max > running_max[g] ? block_max : running_max[g];
            __m512 m = _mm512_set1_ps(new_max);
            __m512 p0 = _mm512_maskz_mov_ps(low, exp16(_mm512_sub_ps(s0, m)));
            __m512 p1 = _mm512_maskz_mov_ps(high, exp16(_mm512_sub_ps(s1, m)));
            _mm512_store_ps(&probs[g][0], p0);
            _mm512_store_ps(&probs[g][16], p1);
            /* rescale what came before to the new maximum (the first block: nothing came before) */
            float rescale = running_max[g] == -INFINITY ? 0.0f : expf(running_max[g] - new_max);
            running_sum[g] = running_sum[g] * rescale + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
            running_max[g] = new_max;
            if (rescale != 1.0f) {
                __m512 r = _mm512_set1_ps(rescale);
                for (int c = 0; c < chunks; c++)
                    _mm512_store_ps(&acc[g][c * 16], _mm512_mul_ps(_mm512_load_ps(&acc[g][c * 16]), r));
            }
        }
        /* acc += probs . values, one value row loaded once for the whole group */
        for (int c = 0; c < chunks; c++) {
            __m512 sums[MAX_GROUP];
            for (int g = 0; g < group; g++) sums[g] = _mm512_load_ps(&acc[g][c * 16]);
            for (int j = 0; j < count; j++) {
                __m512 vc = load16(v + (start + j) * row_bytes + c * 16 * size, bf16);
                for (int g = 0; g < group; g++) sums[g] = _mm512_fmadd_ps(_mm512_set1_ps(probs[g][j]), vc, sums[g]);
            }
            for (int g = 0; g < group; g++) _mm512_store_ps(&acc[g][c * 16], sums[g]);
        }
    }
    for (int g = 0; g < group; g++) {
        __m512 inv = _mm512_set1_ps(1.0f / running_sum[g]);
        for (int c = 0; c < chunks; c++)
            store16(out + (g * dim + c * 16) * size, _mm512_mul_ps(_mm512_load_ps(&acc[g][c * 16]), inv), bf16);
    }
}

/* Specialised copies for the shapes of the models the engine serves (SmolLM2-135M: 3 queries a KV head, head_dim
 * 64; Llama/Qwen-style models: head_dim 64 or 128 with 1-8 queries a KV head); others take the generic copy. */
#define SHAPES(X) X(1, 64) X(2, 64) X(3, 64) X(4, 64) X(1, 128) X(2, 128) X(4, 128) X(7, 128) X(8, 128)
#define DISPATCH(G, D)                                                                                                  \
    if (group == G && dim == D) {                                                                                      \
        attend(q, q_group, k, v, length, out, G, D, scale, bf16);                                                     \
        return;                                                                                                        \
    }

static void attend_f32(const char *q, int64_t q_group, const char *k, const char *v, int64_t length, char *out,
                       int group, int dim, float scale) {
    const int bf16 = 0;
    SHAPES(DISPATCH)
    attend(q, q_group, k, v, length, out, group, dim, scale, bf16);
}

static void attend_bf16(const char *q, int64_t q_group, const char *k, const char *v, int64_t length, char *out,
                        int group, int dim, float scale) {
    const int bf16 = 1;
    SHAPES(DISPATCH)
    attend(q, q_group, k, v, length, out, group, dim, scale, bf16);
}

/* Returns 0, or -1 when the shapes are outside what this kernel handles (the caller then uses SDPA). */
int envhub_decode_attention(const void *q, int64_t q_row, int64_t q_head, int64_t q_group, const void *keys,
                            const void *values, int64_t kv_slot, int64_t kv_head, const int64_t *lengths,
                            int64_t capacity, void *out, int rows, int heads, int group, int dim, float scale,
                            int dtype, int threads) {
    if (group < 1 || group > MAX_GROUP || dim < 16 || dim > MAX_DIM || dim % 16 || (dtype != 0 && dtype != 1))
        return -1;
    const int64_t size = dtype ? 2 : 4;
    const int64_t tasks = (int64_t)rows * heads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (int64_t task = 0; task < tasks; task++) {
        const int64_t row = task / heads, head = task % heads;
        int64_t length = lengths[row];
        length = length < 1 ? 1 : (length > capacity ? capacity : length);
        const char *qp = (const char *)q + (row * q_row + head * q_head) * size;
        const int64_t kv = (row * kv_slot + head * kv_head) * size;
        char *op = (char *)out + (task * group * dim) * size;
        if (dtype)
            attend_bf16(qp, q_group, (const char *)keys + kv, (const char *)values + kv, length, op, group, dim, scale);
        else
            attend_f32(qp, q_group, (const char *)keys + kv, (const char *)values + kv, length, op, group, dim, scale);
    }
    return 0;
}

int envhub_decode_attention_vectorized(void) { return 1; }

#else /* no AVX-512 at build time: the caller keeps SDPA */

int envhub_decode_attention(const void *q, int64_t q_row, int64_t q_head, int64_t q_group, const void *keys,
                            const void *values, int64_t kv_slot, int64_t kv_head, const int64_t *lengths,
                            int64_t capacity, void *out, int rows, int heads, int group, int dim, float scale,
                            int dtype, int threads) {
    return -1;
}

int envhub_decode_attention_vectorized(void) { return 0; }

#endif
