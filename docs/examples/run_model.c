/* run_model.c: run a compiled onnx-aot artifact from C, with no Python and no runtime library.
 *
 * Build against one artifact's header and library (ART is the artifact folder):
 *   cc -O2 -std=c11 -I ART/kernels/cpu run_model.c ART/kernels/cpu/model.so \
 *      -Wl,-rpath,ART/kernels/cpu -o run_model
 * Run: the weights, then one raw little-endian file per input and one path per output, in the
 * order model.h lists them (onnx_aot_inputs / onnx_aot_outputs):
 *   ./run_model ART/weights.bin input0.bin ... output0.bin ...
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"

/* Map weights.bin read-only (the kernels never write it); NULL on failure. */
static const void* map_weights(const char* path)
{
  static _Alignas(64) char empty[64]; /* a valid address for a model without constants */
  if (ONNX_AOT_WEIGHTS_BYTES == 0) {
    return empty;
  }
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    perror(path);
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || (size_t)st.st_size != ONNX_AOT_WEIGHTS_BYTES) {
    fprintf(stderr, "%s: expected %zu bytes\n", path, (size_t)ONNX_AOT_WEIGHTS_BYTES);
    close(fd);
    return NULL;
  }
  void* p = mmap(NULL, ONNX_AOT_WEIGHTS_BYTES, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  return p == MAP_FAILED ? NULL : p;
}

static int read_exactly(const char* path, void* dst, size_t n)
{
  FILE* f = fopen(path, "rb");
  if (f == NULL) {
    perror(path);
    return -1;
  }
  size_t got = fread(dst, 1, n, f);
  int extra = fgetc(f);
  fclose(f);
  if (got != n || extra != EOF) {
    fprintf(stderr, "%s: expected exactly %zu bytes\n", path, n);
    return -1;
  }
  return 0;
}

static int write_all(const char* path, const void* src, size_t n)
{
  FILE* f = fopen(path, "wb");
  if (f == NULL || fwrite(src, 1, n, f) != n) {
    perror(path);
    if (f != NULL) {
      fclose(f);
    }
    return -1;
  }
  return fclose(f) == 0 ? 0 : -1;
}

int main(int argc, char** argv)
{
  if (argc != 2 + ONNX_AOT_NUM_INPUTS + ONNX_AOT_NUM_OUTPUTS) {
    fprintf(stderr, "usage: %s weights.bin", argv[0]);
    for (int i = 0; i < ONNX_AOT_NUM_INPUTS; ++i) {
      fprintf(stderr, " %s.bin", onnx_aot_inputs[i].name);
    }
    for (int i = 0; i < ONNX_AOT_NUM_OUTPUTS; ++i) {
      fprintf(stderr, " %s.out", onnx_aot_outputs[i].name);
    }
    fprintf(stderr, "\n");
    return 2;
  }
  if (onnx_aot_abi_version() != ONNX_AOT_ABI_VERSION) {
    fprintf(stderr, "model.so does not match model.h\n");
    return 1;
  }
  const void* weights = map_weights(argv[1]);
  /* the arena: every intermediate tensor lives at a fixed offset in it */
  size_t arena_bytes = (ONNX_AOT_ARENA_BYTES + ONNX_AOT_ARENA_ALIGNMENT - 1) / ONNX_AOT_ARENA_ALIGNMENT
                       * ONNX_AOT_ARENA_ALIGNMENT;
  void* arena = aligned_alloc(ONNX_AOT_ARENA_ALIGNMENT, arena_bytes > 0 ? arena_bytes : ONNX_AOT_ARENA_ALIGNMENT);
  const void* inputs[ONNX_AOT_NUM_INPUTS + 1] = { NULL };
  void* outputs[ONNX_AOT_NUM_OUTPUTS + 1] = { NULL };
  int status = weights == NULL || arena == NULL;
  for (int i = 0; i < ONNX_AOT_NUM_INPUTS && status == 0; ++i) {
    void* buffer = malloc(onnx_aot_inputs[i].nbytes + 1);
    inputs[i] = buffer;
    status = buffer == NULL || read_exactly(argv[2 + i], buffer, onnx_aot_inputs[i].nbytes) != 0;
  }
  for (int i = 0; i < ONNX_AOT_NUM_OUTPUTS && status == 0; ++i) {
    outputs[i] = malloc(onnx_aot_outputs[i].nbytes + 1);
    status = outputs[i] == NULL;
  }
  if (status == 0) {
    int rc = onnx_aot_run(inputs, outputs, arena, weights, NULL); /* the partitions, in order */
    if (rc != 0) {
      fprintf(stderr, "onnx_aot_run failed with code %d\n", rc);
      status = 1;
    }
  }
  for (int i = 0; i < ONNX_AOT_NUM_OUTPUTS && status == 0; ++i) {
    status = write_all(argv[2 + ONNX_AOT_NUM_INPUTS + i], outputs[i], onnx_aot_outputs[i].nbytes) != 0;
  }
  for (int i = 0; i < ONNX_AOT_NUM_INPUTS; ++i) {
    free((void*)inputs[i]);
  }
  for (int i = 0; i < ONNX_AOT_NUM_OUTPUTS; ++i) {
    free(outputs[i]);
  }
  free(arena);
  if (weights != NULL && ONNX_AOT_WEIGHTS_BYTES != 0) {
    munmap((void*)weights, ONNX_AOT_WEIGHTS_BYTES);
  }
  return status;
}
