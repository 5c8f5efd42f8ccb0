/* A program outside the project, built only from the installed <kvpool/kvpool.h> and
 * libkvpool.so: it hashes a two-block chain and attaches to the daemon at argv[1]. */
#include <kvpool/kvpool.h>
#include <stdio.h>

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: consumer SOCKET\n");
    return 2;
  }
  kvpool_geometry g = {2, 2, 64, 16, 0};
  kvpool_hash root, chain[2];
  uint32_t tokens[32];
  size_t written = 0;
  for (uint32_t i = 0; i < 32; ++i) tokens[i] = i;
  if (kvpool_hash_root("model", &g, NULL, NULL, &root) != KVPOOL_OK ||
      kvpool_hash_chain(&root, tokens, 32, 16, chain, 2, &written) != KVPOOL_OK || written != 2) {
    fprintf(stderr, "hashing failed: %s\n", kvpool_hash_last_error());
    return 1;
  }
  kvpool_conn* c = NULL;
  char err[256];
  int rc = kvpool_attach(argv[1], "consumer", "", &c, err, sizeof err);
  if (rc != KVPOOL_OK) {
    fprintf(stderr, "attach failed (%s): %s\n", kvpool_error_name(rc), err);
    return 1;
  }
  kvpool_page_id pages[2];
  kvpool_publish_item items[2];
  kvpool_publish_result results[2];
  uint32_t hits = 0;
  if (kvpool_alloc(c, 2, pages) != KVPOOL_OK) return 1;
  for (int i = 0; i < 2; ++i) {
    items[i].page = pages[i];
    items[i].hash = chain[i];
  }
  if (kvpool_publish(c, items, 2, results) != KVPOOL_OK) return 1;
  if (kvpool_lookup(c, chain, 2, pages, &hits) != KVPOOL_OK || hits != 2) return 1;
  printf("consumer: hashed and published 2 blocks, found %u\n", hits);
  kvpool_detach(c);
  return 0;
}
