// Reading a cached file and touching each 100-byte record: pread (mode 0) against mmap of the
// same pieces (1), with MAP_POPULATE (2), with MADV_POPULATE_READ (3).
// gcc -O2 -o /tmp/read-vs-map bench/read-vs-map.c && /tmp/read-vs-map FILE MODE PIECE_KIB
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
#include <string.h>
#include <sys/resource.h>
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static double cpu(){struct rusage u;getrusage(RUSAGE_SELF,&u);return u.ru_utime.tv_sec+u.ru_utime.tv_usec*1e-6+u.ru_stime.tv_sec+u.ru_stime.tv_usec*1e-6;}
int main(int c,char**v){int fd=open(v[1],O_RDONLY);size_t n=lseek(fd,0,SEEK_END);int mode=atoi(v[2]);size_t chunk=(size_t)atoi(v[3])<<10;
unsigned long sum=0;double t=now(),c0=cpu();
if(mode==0){char*b=aligned_alloc(4096,chunk);for(size_t o=0;o<n;o+=chunk){ssize_t r=pread(fd,b,chunk,o);for(ssize_t i=0;i<r;i+=100)sum+=b[i];}}
else{for(size_t o=0;o<n;o+=chunk){size_t l=n-o<chunk?n-o:chunk;char*m=mmap(0,l,PROT_READ,MAP_SHARED|(mode==2?MAP_POPULATE:0),fd,o);
 if(mode==3)madvise(m,l,MADV_POPULATE_READ);
 for(size_t i=0;i<l;i+=100)sum+=m[i];munmap(m,l);}}
printf("mode %d chunk %zuK: %.3f s wall %.3f cpu sum %lu\n",mode,chunk>>10,now()-t,cpu()-c0,sum);}
