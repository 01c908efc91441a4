/* etm-bpf demo workload: a small "service" with known hot call chains.
 *
 *   main -> serve -> compress_log   -> crc32_update                       (hottest)
 *   main -> serve -> handle_request -> parse_json   -> scan_tokens
 *   main -> serve -> handle_request -> render_page  -> escape_html
 *   worker thread: worker -> rebuild_index -> sort_keys -> qsort -> compare_keys
 *     (libc's qsort has no frame pointers: those stacks come out shallow, as the view shows)
 *
 * Built with frame pointers so eBPF user stacks are complete:
 *   clang-22 -O1 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer -pthread demo.c
 * Runs until killed (or for argv[1] seconds).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char buf[4096];
volatile uint64_t sink;

__attribute__((noinline)) uint64_t scan_tokens(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
  return h;
}
__attribute__((noinline)) uint64_t parse_json(void) {
  uint64_t h = 0;
  for (int r = 0; r < 40; r++) h += scan_tokens(buf, sizeof buf);
  return h;
}
__attribute__((noinline)) uint64_t escape_html(const char *s, size_t n) {
  uint64_t k = 0;
  for (size_t i = 0; i < n; i++) k += (s[i] == '<' || s[i] == '>' || s[i] == '&') ? 4 : 1;
  return k;
}
__attribute__((noinline)) uint64_t render_page(void) {
  uint64_t k = 0;
  for (int r = 0; r < 20; r++) k += escape_html(buf, sizeof buf);
  return k;
}
__attribute__((noinline)) uint32_t crc32_update(uint32_t crc, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    crc ^= (unsigned char)s[i];
    for (int b = 0; b < 8; b++) crc = (crc >> 1) ^ (0xEDB88320u & -(crc & 1));
  }
  return crc;
}
__attribute__((noinline)) uint64_t compress_log(void) {
  return crc32_update(0, buf, sizeof buf / 2);
}
__attribute__((noinline)) uint64_t handle_request(void) {
  return parse_json() + render_page();
}
__attribute__((noinline)) void serve(void) {
  sink += handle_request();
  sink += compress_log();
}

static int keys[2048];
__attribute__((noinline)) int compare_keys(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}
__attribute__((noinline)) void sort_keys(void) {
  for (int i = 0; i < 2048; i++) keys[i] = (int)((i * 2654435761u) >> 7);
  qsort(keys, 2048, sizeof keys[0], compare_keys);
}
__attribute__((noinline)) void rebuild_index(void) {
  sort_keys();
  usleep(2000); /* the indexer is half idle */
}
__attribute__((noinline)) void *worker(void *arg) {
  (void)arg;
  for (;;) rebuild_index();
  return NULL;
}

int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 0;
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = "<a href=\"x\">&y</a>"[i % 18];
  pthread_t t;
  pthread_create(&t, NULL, worker, NULL);
  printf("demo: pid %d\n", (int)getpid());
  fflush(stdout);
  time_t end = time(NULL) + (time_t)secs;
  while (secs <= 0 || time(NULL) < end) serve();
  return 0;
}
