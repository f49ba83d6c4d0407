/* libgtp.so loads on its own (every dependency resolved) and its entry points resolve through dlsym. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "gtp/gtp.h"

int main(int argc, char** argv) {
  void* lib;
  const char* (*status_string)(gtp_status_t);
  gtp_status_t (*create)(const gtp_context_config_t*, gtp_context_t**);
  gtp_context_t* ctx = NULL;
  if (argc != 2) {
    fprintf(stderr, "usage: %s path/to/libgtp.so\n", argv[0]);
    return 2;
  }
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  *(void**)&status_string = dlsym(lib, "gtp_status_string");
  *(void**)&create = dlsym(lib, "gtp_context_create");
  if (status_string == NULL || create == NULL) {
    fprintf(stderr, "dlsym: %s\n", dlerror());
    return 1;
  }
  if (strcmp(status_string(GTP_ERROR_VERSION), "GTP_ERROR_VERSION") != 0 ||
      create(NULL, &ctx) != GTP_ERROR_INVALID_ARGUMENT || ctx != NULL) {
    fprintf(stderr, "libgtp.so answered wrongly\n");
    return 1;
  }
  dlclose(lib);
  return 0;
}
