#include "common/protocol.h"
