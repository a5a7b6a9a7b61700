/* Embedded.runPython: CPython embedded in a JVM, as Jep embeds it (Py_Initialize on the calling
 * Java thread, the code run there). */
#include <jni.h>
#include <Python.h>

JNIEXPORT void JNICALL Java_Embedded_runPython(JNIEnv *env, jclass cls, jstring code)
{
    (void)cls;
    const char *text = (*env)->GetStringUTFChars(env, code, NULL);
    if (text == NULL)
        return;
    Py_Initialize();
    PyRun_SimpleString(text);
    Py_Finalize();
    (*env)->ReleaseStringUTFChars(env, code, text);
}
