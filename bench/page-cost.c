// What a new anonymous 4 KiB page costs on this machine: first touch, second touch, memset.
// gcc -O2 -o /tmp/page-cost bench/page-cost.c && /tmp/page-cost 1024   (MiB; BENCHMARKS.md, issue 8)
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <string.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int c,char**v){size_t n=(size_t)atoi(v[1])<<20;
for(int r=0;r<3;r++){char*m=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
double t=now();for(size_t o=0;o<n;o+=4096)m[o]=1;double a=now()-t;
t=now();for(size_t o=0;o<n;o+=4096)m[o]=2;double b=now()-t;
t=now();memset(m,3,n);double d=now()-t;
printf("round %d: first touch %.3f us/page, second %.4f us/page, memset %.2f GB/s\n",r,a/(n/4096)*1e6,b/(n/4096)*1e6,n/d/1e9);
munmap(m,n);}
}
