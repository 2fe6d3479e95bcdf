/* C ABI test: load the te pack, select, read the selected backend and the decision JSON,
 * check the error paths (bad config, unknown pack, NULL arguments), the cache counters,
 * and select from several threads at once. Exit 0 on success. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "attn_policy.h"

static int failures = 0;
#define CHECK(cond, ...)                                  \
  do {                                                    \
    if (!(cond)) {                                        \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                       \
      fprintf(stderr, "\n");                              \
      failures++;                                         \
    }                                                     \
  } while (0)

static const char *CONFIG =
    "{\"head_dim_qk\": 128, \"head_dim_v\": 128, \"device_compute_capability\": [9, 0],"
    " \"qkv_dtype\": \"bf16\", \"attn_mask_type\": \"causal\"}";

static void *worker(void *arg) {
  const AttnPolicy *p = (const AttnPolicy *)arg;
  for (int i = 0; i < 1000; i++) {
    AttnDecision *d = NULL;
    char *err = NULL;
    int rc = attn_policy_select(p, CONFIG, &d, &err);
    if (rc != ATTN_POLICY_OK || attn_policy_decision_selected(d) == NULL) {
      __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
    }
    attn_policy_string_free(err);
    attn_policy_decision_free(d);
  }
  return NULL;
}

int main(void) {
  char *err = NULL;
  AttnPolicy *p = NULL;
  CHECK(attn_policy_abi_version() == 1, "abi version");

  int rc = attn_policy_load("te", NULL, 0, 256, &p, &err);
  CHECK(rc == ATTN_POLICY_OK && p != NULL, "load te: rc=%d %s", rc, err ? err : "");
  attn_policy_string_free(err);

  AttnDecision *d = NULL;
  rc = attn_policy_select(p, CONFIG, &d, &err);
  CHECK(rc == ATTN_POLICY_OK && d != NULL, "select: rc=%d %s", rc, err ? err : "");
  const char *sel = attn_policy_decision_selected(d);
  CHECK(sel != NULL, "a backend is selected");
  printf("selected: %s\n", sel ? sel : "(none)");

  char *json = NULL;
  rc = attn_policy_decision_render(d, ATTN_POLICY_FORMAT_JSON, &json, &err);
  CHECK(rc == ATTN_POLICY_OK && json && strstr(json, "\"schema\":\"attn-policy/explain/v1\""),
        "decision json");
  CHECK(json && sel && strstr(json, sel), "json names the selected backend");
  /* The chain the decision would walk (the ABI runs nothing: every entry not_tried). */
  CHECK(json && strstr(json, "\"executor_chain\":[{\"executor\":") &&
            strstr(json, "\"outcome\":\"not_tried\""),
        "json reports the executor chain");
  attn_policy_string_free(json);

  char *text = NULL;
  rc = attn_policy_decision_render(d, ATTN_POLICY_FORMAT_TEXT, &text, &err);
  CHECK(rc == ATTN_POLICY_OK && text && strncmp(text, "selected: ", 10) == 0, "text");
  attn_policy_string_free(text);

  char *te = NULL;
  rc = attn_policy_decision_render(d, ATTN_POLICY_FORMAT_TE, &te, &err);
  CHECK(rc == ATTN_POLICY_OK && te && strstr(te, "\"available_backends\""), "te tuple");
  attn_policy_string_free(te);
  attn_policy_decision_free(d);

  /* A bad config: error code and the CLI's message, no decision. */
  d = NULL;
  rc = attn_policy_select(p, "{\"head_dimqk\": 1}", &d, &err);
  CHECK(rc == ATTN_POLICY_CONFIG_ERROR && d == NULL, "bad config rc=%d", rc);
  CHECK(err && strstr(err, "did you mean `head_dim_qk`"), "did-you-mean: %s", err ? err : "");
  attn_policy_string_free(err);
  err = NULL;
  rc = attn_policy_select(p, "not json", &d, &err);
  CHECK(rc == ATTN_POLICY_CONFIG_ERROR && err, "not json rc=%d", rc);
  attn_policy_string_free(err);
  err = NULL;
  /* An impossible config is refused with the key's position in the text. */
  rc = attn_policy_select(p, "{\"num_heads\": 8,\n \"num_gqa_groups\": 3}", &d, &err);
  CHECK(rc == ATTN_POLICY_CONFIG_ERROR && d == NULL, "kv heads rc=%d", rc);
  CHECK(err && strstr(err, "config_json:2:2") && strstr(err, "num_gqa_groups"), "located: %s",
        err ? err : "");
  attn_policy_string_free(err);
  err = NULL;
  rc = attn_policy_select(p, "{\"num_heads\": 8, \"num_heads\": 4}", &d, &err);
  CHECK(rc == ATTN_POLICY_CONFIG_ERROR && err && strstr(err, "duplicate key"), "duplicate: %s",
        err ? err : "");
  attn_policy_string_free(err);
  err = NULL;

  /* NULL arguments and unknown packs. */
  rc = attn_policy_select(p, NULL, &d, &err);
  CHECK(rc == ATTN_POLICY_INVALID_ARGUMENT, "NULL config rc=%d", rc);
  attn_policy_string_free(err);
  err = NULL;
  AttnPolicy *q = NULL;
  rc = attn_policy_load("tee", NULL, 0, 16, &q, &err);
  CHECK(rc == ATTN_POLICY_PACK_ERROR && q == NULL && err && strstr(err, "unknown pack"),
        "unknown pack rc=%d", rc);
  attn_policy_string_free(err);
  err = NULL;
  rc = attn_policy_load(NULL, "/nonexistent-pack-dir", 0, 16, &q, &err);
  CHECK(rc == ATTN_POLICY_PACK_ERROR && err, "missing dir rc=%d", rc);
  attn_policy_string_free(err);
  err = NULL;

  /* Threads share one policy and its cache. */
  pthread_t t[8];
  for (int i = 0; i < 8; i++) pthread_create(&t[i], NULL, worker, p);
  for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
  uint64_t hits = 0, misses = 0, ev = 0;
  attn_policy_cache_stats(p, &hits, &misses, &ev);
  printf("cache: %llu hits, %llu misses\n", (unsigned long long)hits, (unsigned long long)misses);
  CHECK(hits + misses == 8001 && hits >= 7990, "cache counters");

  attn_policy_free(p);
  if (failures) {
    fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  printf("C ABI: all checks passed\n");
  return 0;
}
