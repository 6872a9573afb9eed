/* The process-wide kernel switches that an engine's choices set (the ft_set_* calls of
 * kernels/choices.py), read and written as one array. An engine applies its choices to the whole
 * library, so a process computes with one engine's choices at a time; tests/conftest.py saves the
 * array before every test and writes it back after, so the choices (calibrated, so timing-dependent)
 * of a test's engine never change what a later test's kernels compute. */
#include "ft_kernels.h"

extern int ft_bf16_dot_on, ft_gemv_amx, ft_att_amx, ft_prefill_att_mode, ft_gemm_mode, ft_gemm_min, ft_gemm_dense,
    ft_ggml_act_mode, ft_ggml_k256, ft_ggml_tiles, ft_ggml_group_min;

static int *const SWITCHES[] = {&ft_bf16_dot_on, &ft_gemv_amx, &ft_att_amx, &ft_prefill_att_mode, &ft_gemm_mode,
                                &ft_gemm_min, &ft_gemm_dense, &ft_ggml_act_mode, &ft_ggml_act_llama, &ft_ggml_k256,
                                &ft_ggml_tiles, &ft_ggml_group_min, &ft_int8_zmm};
#define N_SWITCHES ((int)(sizeof SWITCHES / sizeof SWITCHES[0]))

/* Copies the switches into `save` (unless NULL), then sets them from `restore` (unless NULL); returns
 * how many there are (the arrays' length). */
int ft_switches(int *save, const int *restore) {
    for (int i = 0; i < N_SWITCHES; i++) {
        if (save) save[i] = *SWITCHES[i];
        if (restore) *SWITCHES[i] = restore[i];
    }
    return N_SWITCHES;
}
