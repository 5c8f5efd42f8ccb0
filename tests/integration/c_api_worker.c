/* A worker written in C against client/capi/kvpool.h: proves the header is C and the calls work.
 * Usage: c_api_worker SOCKET. Exits 0 when every step behaved, else the failing step's number. */
#include <stdio.h>
#include <string.h>

#include "client/capi/kvpool.h"

int main(int argc, char** argv) {
  if (argc != 2) return 100;
  char err[256] = "";
  kvpool_conn* c = NULL;
  if (kvpool_attach(argv[1], "c-worker", NULL, &c, err, sizeof err) != KVPOOL_OK) {
    fprintf(stderr, "attach: %s\n", err);
    return 1;
  }
  kvpool_pool_info info;
  kvpool_get_pool_info(c, &info);
  if (info.num_pages == 0 || info.page_stride == 0 || kvpool_base(c) == NULL) return 2;
  if (info.device != -1) return 2; /* the host backend */
  if (info.layout != 0 || info.layer_stride != 0) return 2; /* page_major, the default */

  kvpool_page_id pages[2];
  if (kvpool_alloc(c, 2, pages) != KVPOOL_OK) return 3;
  memset((char*)kvpool_base(c) + (size_t)pages[0] * info.page_stride, 0x42, info.page_stride);
  /* The daemon copies page 0 into page 1; a page copied onto itself is refused. */
  if (kvpool_copy(c, &pages[0], &pages[1], 1) != KVPOOL_OK) return 12;
  if (memcmp((char*)kvpool_base(c) + (size_t)pages[0] * info.page_stride,
             (char*)kvpool_base(c) + (size_t)pages[1] * info.page_stride, info.page_stride) != 0)
    return 13;
  if (kvpool_copy(c, &pages[0], &pages[0], 1) == KVPOOL_OK) return 14;

  kvpool_publish_item items[2] = {{pages[0], {1, 2}}, {pages[1], {3, 4}}};
  kvpool_publish_result results[2];
  if (kvpool_publish(c, items, 2, results) != KVPOOL_OK) return 4;
  if (results[0].duplicate || results[0].page != pages[0]) return 5;

  kvpool_hash chain[3] = {{1, 2}, {3, 4}, {5, 6}};
  kvpool_page_id found[3];
  uint32_t hits = 0;
  if (kvpool_lookup(c, chain, 3, found, &hits) != KVPOOL_OK || hits != 2) return 6;
  if (found[0] != pages[0]) return 7;

  /* Errors come back as codes with a message naming the cause. */
  kvpool_page_id bogus = 4000000000u;
  const int code = kvpool_release(c, &bogus, 1);
  if (code == KVPOOL_OK || strstr(kvpool_last_error(c), "4000000000") == NULL) return 8;

  if (kvpool_release(c, found, hits) != KVPOOL_OK) return 9;
  if (kvpool_release(c, pages, 2) != KVPOOL_OK) return 10;
  kvpool_stats s;
  if (kvpool_get_stats(c, &s) != KVPOOL_OK || s.in_use != 0 || s.cached != 2) return 11;
  kvpool_detach(c);
  printf("c worker ok\n");
  return 0;
}
