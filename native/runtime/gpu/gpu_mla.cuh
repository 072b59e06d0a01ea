// Part of gpu_runtime.cu (included there, one translation unit): MLA attention, the "mla" extension.

// ---- MLA attention (DeepSeek-V3), the absorbed form over a cache of the latent and the rope key ----------

#define MAX_MLA_RANK 512 // kv_lora_rank
#define MAX_MLA_ROW 640  // kv_lora_rank + qk_rope_head_dim: a cache row

// The rotation of one head vector of rope values by the block's threads (i < rope / 2 each take a pair): interleaved
// pairs (x[2i], x[2i+1]) written de-interleaved, or halves (x[i], x[i + rope/2]), as the CPU's eb_rope_interleaved
// and eb_rope.
__device__ __forceinline__ void mla_rope(const float *x, const float *cs, const float *sn, int rope, int interleave,
                                         float *out) {
    int half = rope / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float a = interleave ? x[2 * i] : x[i], b = interleave ? x[2 * i + 1] : x[i + half];
        out[i] = a * cs[i] - b * sn[i];
        out[i + half] = b * cs[i] + a * sn[i];
    }
}

// One block per new row: the latent's RMSNorm and the rope key's rotation into the cache at the row's position.
__global__ void mla_cache_kernel(eb_rt_mla a, int warp) {
    __shared__ float sh[33];
    int t = blockIdx.x, R = a.rank, P = a.rope, C = R + P;
    long long p = *a.pos + t;
    const float *kv = a.kv + (long long)t * C;
    float *row = a.cache + p * C;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < R; i += blockDim.x) ss += kv[i] * kv[i];
    float inv = rsqrtf(block_sum(ss, sh, warp) / (float)R + a.eps);
    for (int i = threadIdx.x; i < R; i += blockDim.x) row[i] = a.kv_norm[i] * (kv[i] * inv);
    mla_rope(kv + R, a.rope_cos + p * (P / 2), a.rope_sin + p * (P / 2), P, a.interleave, row + R);
}

// One block per (head, row), ATT_GROUPS groups of 32 lanes: the absorbed query (q_nope through the head's k_b rows,
// a warp per latent dimension; q_pe rotated) in shared memory, then groups of lanes take cache positions in turn
// with a running softmax over the latent (each lane holds row / 32 of it), merged; then out = v_b . the latent mix,
// a warp per value dimension.
__global__ void mla_attend_kernel(eb_rt_mla a, int warp) {
    __shared__ float qs[MAX_MLA_ROW], mix[MAX_MLA_RANK];
    __shared__ float gm[ATT_GROUPS], gl[ATT_GROUPS];
    __shared__ float gacc[ATT_GROUPS][MAX_MLA_RANK];
    int h = blockIdx.x, t = blockIdx.y, R = a.rank, P = a.rope, N = a.nope, C = R + P;
    long long p = *a.pos + t;
    const float *q = a.q + ((long long)t * a.n_heads + h) * (N + P);
    int wl = threadIdx.x % warp, wid = threadIdx.x / warp, nw = blockDim.x / warp;
    for (int r = wid; r < R; r += nw) {
        float v = warp_dot(a.k_b, a.k_b_dtype, (long long)h * R + r, N, q, wl, warp);
        if (wl == 0) qs[r] = v * a.scale;
    }
    mla_rope(q + N, a.rope_cos + p * (P / 2), a.rope_sin + p * (P / 2), P, a.interleave, qs + R);
    __syncthreads();
    for (int i = R + threadIdx.x; i < C; i += blockDim.x) qs[i] *= a.scale;
    __syncthreads();
    int lane = threadIdx.x % 32, g = threadIdx.x / 32, ng = blockDim.x / 32;
    float qv[MAX_MLA_ROW / 32], acc[MAX_MLA_RANK / 32];
#pragma unroll
    for (int i = 0; i < MAX_MLA_ROW / 32; i++) qv[i] = lane + 32 * i < C ? qs[lane + 32 * i] : 0.0f;
#pragma unroll
    for (int i = 0; i < MAX_MLA_RANK / 32; i++) acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (long long s = g; s <= p; s += ng) {
        const float *row = a.cache + s * C;
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < MAX_MLA_ROW / 32; i++) {
            int c = lane + 32 * i;
            if (c < C) d += qv[i] * row[c];
        }
        for (int o = 16; o > 0; o /= 2) d += SHFL_XOR32(d, o);
        float mn = fmaxf(m, d), corr = expf(m - mn), e = expf(d - mn);
        l = l * corr + e;
#pragma unroll
        for (int i = 0; i < MAX_MLA_RANK / 32; i++) {
            int c = lane + 32 * i;
            if (c < R) acc[i] = acc[i] * corr + e * row[c];
        }
        m = mn;
    }
    if (lane == 0) gm[g] = m, gl[g] = l;
#pragma unroll
    for (int i = 0; i < MAX_MLA_RANK / 32; i++)
        if (lane + 32 * i < R) gacc[g][lane + 32 * i] = acc[i];
    __syncthreads();
    float M = -INFINITY, L = 0.0f;
    for (int j = 0; j < ng; j++) M = fmaxf(M, gm[j]);
    for (int j = 0; j < ng; j++) L += gm[j] == -INFINITY ? 0.0f : gl[j] * expf(gm[j] - M);
    for (int c = threadIdx.x; c < R; c += blockDim.x) {
        float o = 0.0f;
        for (int j = 0; j < ng; j++)
            if (gm[j] != -INFINITY) o += gacc[j][c] * expf(gm[j] - M);
        mix[c] = o / L;
    }
    __syncthreads();
    float *out = a.out + ((long long)t * a.n_heads + h) * a.v_dim;
    for (int j = wid; j < a.v_dim; j += nw) {
        float v = warp_dot(a.v_b, a.v_b_dtype, (long long)h * a.v_b_head_rows + j, R, mix, wl, warp);
        if (wl == 0) out[j] = v;
    }
}

#define MAX_EXPERTS 512
// EB_ROUTE_SIGMOID_GROUP by one warp (lanes 0..31) over a row's logits in shared memory, as the CPU's
// eb_route_sigmoid_group_row: sigmoid scores, the biased scores for the choice (the groups not kept at 0), the group
// choice and the top k on lane 0 in ascending index order (ties to the lower), the weights the chosen scores.
__device__ void route_sigmoid_group(const eb_rt_route &r, int t, float *scores, unsigned char *taken, int lane) {
    __shared__ float choice[MAX_EXPERTS], group[256];
    int E = r.n_experts, K = r.top_k, G = r.n_group, per = E / G;
    for (int e = lane; e < E; e += 32) {
        scores[e] = 1.0f / (1.0f + expf(-scores[e]));
        choice[e] = scores[e] + r.bias[e];
    }
    WARP_SYNC();
    if (r.topk_group < G) {
        for (int g = lane; g < G; g += 32) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (choice[e] > b1) b2 = b1, b1 = choice[e];
                else if (choice[e] > b2) b2 = choice[e];
            }
            group[g] = b1 + b2;
        }
        WARP_SYNC();
        if (lane == 0) {
            for (int g = 0; g < G; g++) taken[g] = 0;
            for (int k = 0; k < r.topk_group; k++) {
                int best = 0;
                while (taken[best]) best++;
                for (int g = best + 1; g < G; g++)
                    if (!taken[g] && group[g] > group[best]) best = g;
                taken[best] = 1;
            }
            for (int g = 0; g < G; g++)
                if (!taken[g])
                    for (int e = g * per; e < (g + 1) * per; e++) choice[e] = 0.0f;
        }
        WARP_SYNC();
    }
    if (lane != 0) return;
    for (int e = 0; e < E; e++) taken[e] = 0;
    int ids[MAX_TOPK];
    float w[MAX_TOPK], total = 0.0f;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || choice[e] > choice[best])) best = e;
        taken[best] = 1;
        ids[k] = best;
        w[k] = scores[best];
        if (r.norm_topk) total += w[k];
    }
    for (int k = 0; k < K; k++) {
        r.topk_id[(long long)t * K + k] = ids[k];
        r.topk_w[(long long)t * K + k] = (r.norm_topk ? w[k] / (total + 1e-20f) : w[k]) * r.scale;
        if (r.hits) atomicAdd(&r.hits[ids[k]], 1ULL);
    }
}

#define ROUTE_THREADS 128 // the threads of each of a decode row's blocks

// Per row: its RMSNorm (block x 0 writes xn), the router's logits (a warp per expert row, the row normalised on the
// fly exactly as xn is written), then warp 0 takes the top k by k rounds of a warp arg-max (ties to the lower id):
// of the softmax over every expert (EB_ROUTE_SOFTMAX_TOPK), or of the logits plus the router's bias, their weights
// the softmax over the k chosen (EB_ROUTE_TOPK_SOFTMAX, as the CPU's eb_route_topk_softmax_row).
// grid.y = row. A prefill's many rows: one block of 1024 threads per row (grid.x = 1). Decode's few rows (at most
// DOT_TILE): a row's expert rows spread over grid.x blocks of ROUTE_THREADS, so that many SMs read the router
// (one SM alone read it at about 20 GB/s), and the last block to arrive (arrivals[row]) makes the choice.
// THREADS: the block's (1024 for a prefill's rows, ROUTE_THREADS for decode's), which bounds its registers.
template <int THREADS>
__global__ void __launch_bounds__(THREADS) route_kernel(eb_rt_route r, unsigned int *arrivals, int warp) {
    __shared__ float logits[MAX_EXPERTS];
    __shared__ unsigned char taken[MAX_EXPERTS];
    __shared__ int last;
    int t = blockIdx.y, H = (int)r.norm.dim, E = r.n_experts, K = r.top_k;
    int lane = threadIdx.x % warp, wid = threadIdx.x / warp, nw = blockDim.x / warp;
    int first = blockIdx.x * nw, stride = gridDim.x * nw; // this block's expert rows: first + wid + k * stride
    const float *xr = r.norm.x + (long long)t * H;
    if (gridDim.y <= DOT_TILE) // router rows on their way meanwhile (a few rows: not once per row of a prefill)
        for (int e = first + wid; e < E; e += stride) prefetch_row(r.router, r.router_dtype, e, H, lane, warp);
    int dot16 = !quantized(r.router_dtype) && r.router_dtype != EB_DTYPE_F32 && (H % 8) == 0;
    float row_inv = 0.0f;
    long long warps = (long long)gridDim.x * nw, g = (long long)blockIdx.x * nw + wid; // the row's warps write xn
    auto scale = [&]() { // every warp its own scale (no barrier); with dot16, its first router loads in flight
        row_inv = warp_row_inv(xr, H, r.norm.eps, lane, warp);
        write_normed(xr, r.norm.w, 1, H, &row_inv, r.norm.xn + (long long)t * H, g, warps, lane, warp);
        return row_inv;
    };
    int e = first + wid;
    float v0 = dot16 && e < E ? warp_dot16(r.router, r.router_dtype, e, H, xr, lane, warp, r.norm.w, scale) : scale();
    float inv[DOT_TILE] = {row_inv, row_inv, row_inv, row_inv};
    const float *xs[DOT_TILE] = {xr, xr, xr, xr};
    int chosen_logits = r.scoring == EB_ROUTE_TOPK_SOFTMAX; // the top k of the (biased) logits themselves
    float *row_logits = r.logits + (long long)t * E;
    for (; e < E; e += stride) {
        float v[DOT_TILE];
        if (dot16 && e == first + wid)
            v[0] = v0;
        else if (dot16)
            v[0] = warp_dot16(r.router, r.router_dtype, e, H, xr, lane, warp, r.norm.w, [&]() { return row_inv; });
        else
            warp_dot_tile(r.router, r.router_dtype, e, H, xs, 1, lane, warp, v, r.norm.w, inv);
        if (chosen_logits && r.bias) v[0] += r.bias[e];
        if (lane == 0) row_logits[e] = v[0];
    }
    if (gridDim.x > 1) { // the last block of the row to arrive goes on; it sets the count back for the next launch
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            last = atomicAdd(&arrivals[t], 1u) == gridDim.x - 1;
            if (last) arrivals[t] = 0;
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
    } else {
        __syncthreads(); // the block's writes of the logits are visible to the block
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x) logits[e] = ((volatile const float *)row_logits)[e];
    __syncthreads();
    if (threadIdx.x >= 32) return;
    lane = threadIdx.x;
    if (r.scoring == EB_ROUTE_SIGMOID_GROUP) {
        route_sigmoid_group(r, t, logits, taken, lane);
        return;
    }
    float mx = -INFINITY, sum = 0.0f;
    if (!chosen_logits) {
        for (int e = lane; e < E; e += 32) mx = fmaxf(mx, logits[e]);
        for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, SHFL_XOR32(mx, o));
        for (int e = lane; e < E; e += 32) sum += expf(logits[e] - mx);
        for (int o = 16; o > 0; o /= 2) sum += SHFL_XOR32(sum, o);
        // the probabilities once, each lane its own entries (the rounds below read only those): the same values
        // every round would compute again
        for (int e = lane; e < E; e += 32) logits[e] = expf(logits[e] - mx) / sum;
    }
    for (int e = lane; e < E; e += 32) taken[e] = 0;
    float total = 0.0f, top[MAX_TOPK];
    for (int k = 0; k < K; k++) {
        // the first candidate is always taken (id == E), so NaN probabilities still select a valid expert
        float best = 0.0f;
        int id = E;
        for (int e = lane; e < E; e += 32) {
            float pe = logits[e]; // the probability, or the (biased) logit itself
            if (!taken[e] && (id == E || pe > best)) best = pe, id = e; // ascending e: the first of equals stays
        }
        for (int o = 16; o > 0; o /= 2) {
            float ob = SHFL_XOR32(best, o);
            int oid = SHFL_XOR32(id, o);
            if (oid != E && (id == E || ob > best || (ob == best && oid < id))) best = ob, id = oid;
        }
        if (lane == id % 32) taken[id] = 1; // only this lane reads that entry
        if (lane == 0) {
            r.topk_id[(long long)t * K + k] = id;
            top[k] = best;
            if (r.hits) atomicAdd(&r.hits[id], 1ULL);
        }
        total += best;
    }
    if (lane != 0) return;
    if (chosen_logits) { // the softmax over the chosen, from the first (the largest), in the order chosen
        float first = top[0], denom = 0.0f;
        for (int k = 0; k < K; k++) denom += top[k] = expf(top[k] - first);
        for (int k = 0; k < K; k++) r.topk_w[(long long)t * K + k] = top[k] / denom;
        return;
    }
    for (int k = 0; k < K; k++) r.topk_w[(long long)t * K + k] = r.norm_topk ? top[k] / total : top[k];
}

// The next (up to DOT_TILE) selections of expert e from q on: their indices into pairs, q moved past them.
__device__ __forceinline__ int next_pairs(const int *topk_id, int total, int e, int &q, int *pairs) {
    int nt = 0;
    for (; q < total && nt < DOT_TILE; q++)
        if (topk_id[q] == e) {
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++) // constant indices: pairs stays in registers
                if (j == nt) pairs[j] = q;
            nt++;
        }
    return nt;
}

// grid.y = expert: the pairs routed to it (found by scanning the selections), DOT_TILE at a time per weight row.
__global__ void moe_gate_up_kernel(eb_rt_moe b, int warp) {
    const eb_rt_expert ex = b.experts[blockIdx.y];
    if (!ex.gate) return;
    int lane = threadIdx.x % warp;
    int i = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp;
    int total = b.n * b.top_k, e = blockIdx.y;
    if (b.stats && blockIdx.x == 0 && threadIdx.x == 0) {
        int rows = 0;
        for (int q = 0; q < total; q++) rows += b.topk_id[q] == e;
        if (rows) atomicAdd(&b.stats[0], 1ULL), atomicAdd(&b.stats[1], (unsigned long long)rows);
    }
    if (i >= b.inter) return;
    int q = 0;
    while (q < total) {
        int pairs[DOT_TILE] = {0, 0, 0, 0};
        int nt = next_pairs(b.topk_id, total, e, q, pairs);
        if (!nt) break;
        const float *xs[DOT_TILE];
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++) xs[j] = b.xn + (long long)((j < nt ? pairs[j] : pairs[0]) / b.top_k) * b.hidden;
        float gs[DOT_TILE], us[DOT_TILE];
        warp_dot_tile(ex.gate, ex.gate_dtype, i, b.hidden, xs, nt, lane, warp, gs);
        warp_dot_tile(ex.up, ex.up_dtype, i, b.hidden, xs, nt, lane, warp, us);
        if (lane == 0)
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++)
                if (j < nt)
                    b.h[(long long)pairs[j] * b.inter + i] =
                        expert_act(b.act, biased(gs[j], ex.bias, i), biased(us[j], ex.bias, (long long)b.inter + i));
    }
}

__global__ void moe_down_kernel(eb_rt_moe b, int warp) {
    const eb_rt_expert ex = b.experts[blockIdx.y];
    if (!ex.gate) return;
    int lane = threadIdx.x % warp;
    int j0 = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp;
    if (j0 >= b.hidden) return;
    int total = b.n * b.top_k, e = blockIdx.y, q = 0;
    while (q < total) {
        int pairs[DOT_TILE] = {0, 0, 0, 0};
        int nt = next_pairs(b.topk_id, total, e, q, pairs);
        if (!nt) break;
        const float *hs[DOT_TILE];
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++) hs[j] = b.h + (long long)(j < nt ? pairs[j] : pairs[0]) * b.inter;
        float ys[DOT_TILE];
        warp_dot_tile(ex.down, ex.down_dtype, j0, b.inter, hs, nt, lane, warp, ys);
        if (lane == 0)
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++)
                if (j < nt)
                    b.pair_out[(long long)pairs[j] * b.hidden + j0] = biased(ys[j], ex.bias, 2LL * b.inter + j0);
    }
}

// One weighted output added to a row's sum, rounded once (what nvcc and hipcc made of `s += v * w`): the one
// expression of both combinations, moe_combine_kernel's and moe_pair_down_kernel's, so that EB_MOE_ALL gives the
// bits of EB_MOE_EXPERTS then EB_MOE_COMBINE whether a compiler would have contracted it or not.
__device__ __forceinline__ float combine_term(float s, float v, float w) { return fmaf(v, w, s); }

// x[t] += the row's expert outputs, weighted, in ascending expert id (the other owners' from foreign).
__global__ void moe_combine_kernel(eb_rt_moe b) {
    int t = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= b.hidden) return;
    const int *ids = b.topk_id + (long long)t * b.top_k;
    int owner_local = b.mode == EB_REDUCE_OWNER_LOCAL;
    float s = 0.0f;
    int done = -1;
    for (int n = 0; n < b.top_k; n++) {
        int k = -1;
        for (int i = 0; i < b.top_k; i++)
            if (ids[i] > done && (k < 0 || ids[i] < ids[k])) k = i;
        done = ids[k];
        long long pair = (long long)t * b.top_k + k;
        const float *row = b.experts[done].gate ? b.pair_out : owner_local ? NULL : b.foreign;
        if (row) s = combine_term(s, row[pair * b.hidden + j], b.topk_w[pair]);
    }
    if (owner_local && b.foreign) s += b.foreign[(long long)t * b.hidden + j];
    b.x[(long long)t * b.hidden + j] += s;
}

// Few rows (decode, short verify batches): a block per (rows, selected pair) instead of per (rows, expert).
__global__ void moe_pair_gate_up_kernel(eb_rt_moe b, int warp) {
    int pair = blockIdx.y, e = b.topk_id[pair];
    const eb_rt_expert ex = b.experts[e];
    if (!ex.gate) return;
    if (b.stats && blockIdx.x == 0 && threadIdx.x == 0) {
        int first = 1; // an expert counts once per layer step: at its first pair
        for (int q = 0; q < pair; q++) first &= b.topk_id[q] != e;
        atomicAdd(&b.stats[1], 1ULL);
        if (first) atomicAdd(&b.stats[0], 1ULL);
    }
    int lane = threadIdx.x % warp;
    int i = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp;
    if (i >= b.inter) return;
    const float *x = b.xn + (long long)(pair / b.top_k) * b.hidden;
    const float *xs[DOT_TILE] = {x, x, x, x};
    const void *ws[DOT_TILE] = {ex.gate, ex.up, ex.up, ex.up};
    float gu[DOT_TILE];
    if (ex.gate_dtype == ex.up_dtype) {
        warp_dot_rows(ws, ex.gate_dtype, i, b.hidden, xs, 2, lane, warp, gu); // gate and up rows in one pass
    } else {
        float us[DOT_TILE];
        warp_dot_tile(ex.gate, ex.gate_dtype, i, b.hidden, xs, 1, lane, warp, gu);
        warp_dot_tile(ex.up, ex.up_dtype, i, b.hidden, xs, 1, lane, warp, us);
        gu[1] = us[0];
    }
    if (lane == 0)
        b.h[(long long)pair * b.inter + i] =
            expert_act(b.act, biased(gu[0], ex.bias, i), biased(gu[1], ex.bias, (long long)b.inter + i));
}

// The down products of a row's pairs and their sum in one: a warp per output element j of row t. The pairs are
// put in ascending expert id (the order moe_combine_kernel adds them in), their products computed four at a time
// with the loads in flight together, then added in that order (combine = 1: EB_MOE_ALL). combine = 0
// (EB_MOE_EXPERTS): the same products, written to pair_out instead of added, so that moe_combine_kernel
// (EB_MOE_COMBINE) then adds the same values in the same order with the same combine_term: the same bits.
// combine is a template parameter, so that the EB_MOE_ALL build is the fused kernel alone, with no branch on it.
template <int combine> __global__ void __launch_bounds__(BLOCK, 2) moe_pair_down_kernel(eb_rt_moe b, int warp) {
    int t = blockIdx.y, lane = threadIdx.x % warp;
    int j = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp;
    if (j >= b.hidden) return;
    const int *ids = b.topk_id + (long long)t * b.top_k;
    int owner_local = b.mode == EB_REDUCE_OWNER_LOCAL;
    int order[MAX_TOPK];
    int done = -1;
    for (int n = 0; n < b.top_k; n++) {
        int k = -1;
        for (int i = 0; i < b.top_k; i++)
            if (ids[i] > done && (k < 0 || ids[i] < ids[k])) k = i;
        order[n] = k;
        done = ids[k];
    }
    float s = 0.0f;
    for (int n0 = 0; n0 < b.top_k; n0 += DOT_TILE) {
        const void *ws[DOT_TILE];
        const float *hs[DOT_TILE], *bs[DOT_TILE];
        float v[DOT_TILE];
        int nt = 0, dtype = -1, same = 1;
#pragma unroll
        for (int q = 0; q < DOT_TILE; q++) {
            int k = n0 + q < b.top_k ? order[n0 + q] : order[n0];
            const eb_rt_expert ex = b.experts[ids[k]];
            ws[q] = ex.gate ? ex.down : NULL;
            bs[q] = ex.gate ? ex.bias : NULL;
            hs[q] = b.h + ((long long)t * b.top_k + k) * b.inter;
            if (n0 + q < b.top_k) {
                nt = q + 1;
                if (ex.gate) same &= dtype < 0 || ex.down_dtype == dtype, dtype = ex.down_dtype;
            }
        }
        // experts elsewhere have no weights here: give them an owned row to read (the value is not used)
        const void *any = NULL;
#pragma unroll
        for (int q = 0; q < DOT_TILE; q++)
            if (!any && ws[q]) any = ws[q];
        if (any) {
            if (same) {
                const void *wr[DOT_TILE];
#pragma unroll
                for (int q = 0; q < DOT_TILE; q++) wr[q] = ws[q] ? ws[q] : any;
                warp_dot_rows(wr, dtype, j, b.inter, hs, nt, lane, warp, v);
            } else {
                // not unrolled (hipcc could not): the rare path of experts whose down weights differ in format
                for (int q = 0; q < DOT_TILE; q++) {
                    const float *h1[DOT_TILE] = {hs[q], hs[q], hs[q], hs[q]};
                    float y[DOT_TILE];
                    const eb_rt_expert ex = b.experts[ids[n0 + q < b.top_k ? order[n0 + q] : order[n0]]];
                    if (q < nt && ws[q]) warp_dot_tile(ws[q], ex.down_dtype, j, b.inter, h1, 1, lane, warp, y);
                    float vq = q < nt && ws[q] ? y[0] : 0.0f;
#pragma unroll
                    for (int r = 0; r < DOT_TILE; r++) // constant indices: v stays in registers
                        if (r == q) v[r] = vq;
                }
            }
#pragma unroll
            for (int q = 0; q < DOT_TILE; q++) // the down biases, before the output is stored or weighted
                if (q < nt && ws[q]) v[q] = biased(v[q], bs[q], 2LL * b.inter + j);
        }
#pragma unroll
        for (int q = 0; q < DOT_TILE; q++) {
            if (q >= nt) continue;
            long long pair = (long long)t * b.top_k + order[n0 + q];
            if (!combine) {
                if (ws[q] && lane == 0) b.pair_out[pair * b.hidden + j] = v[q];
                continue;
            }
            float val;
            if (ws[q]) val = v[q];
            else if (!owner_local && b.foreign) val = b.foreign[pair * b.hidden + j]; // NULL: as moe_combine_kernel
            else continue;
            s = combine_term(s, val, b.topk_w[pair]);
        }
    }
    if (!combine) return;
    if (owner_local && b.foreign) s += b.foreign[(long long)t * b.hidden + j];
    if (lane == 0) b.x[(long long)t * b.hidden + j] += s;
}
