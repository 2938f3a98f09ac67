using System.Buffers;

namespace TechEmpower;

/// <summary>
/// The TechEmpower plaintext and JSON tests as the first middleware of the pipeline: a path match
/// and a direct write to the response pipe, ahead of routing and MVC so they pay for neither.
/// Kestrel adds the Server and Date headers; each response sets Content-Type and Content-Length,
/// and the JSON body is serialized per request. Every other path goes on down the pipeline.
/// </summary>
public static class TechEmpowerMiddleware
{
    /// <summary>The plaintext test's path.</summary>
    public const string PlaintextPath = "/plaintext";

    /// <summary>The JSON test's path.</summary>
    public const string JsonPath = "/json";

    private const string PlainTextContentType = "text/plain";
    private const string JsonContentType = "application/json";

    private static ReadOnlySpan<byte> HelloWorld => "Hello, World!"u8;

    /// <summary>Builds the middleware: use it with <c>app.Use(TechEmpowerMiddleware.Create)</c>.</summary>
    /// <param name="next">The rest of the pipeline, for every other path.</param>
    /// <returns>The middleware.</returns>
    public static RequestDelegate Create(RequestDelegate next)
    {
        ArgumentNullException.ThrowIfNull(next);

        return context =>
        {
            var path = context.Request.Path.Value;
            if (string.Equals(path, PlaintextPath, StringComparison.Ordinal))
            {
                WritePlaintext(context.Response);
                return Task.CompletedTask;
            }

            if (string.Equals(path, JsonPath, StringComparison.Ordinal))
            {
                WriteJson(context.Response);
                return Task.CompletedTask;
            }

            return next(context);
        };
    }

    // Both writers return without awaiting: the body sits in the response pipe and Kestrel flushes
    // it when the request ends.
    private static void WritePlaintext(HttpResponse response)
    {
        var body = HelloWorld;
        response.StatusCode = StatusCodes.Status200OK;
        response.ContentType = PlainTextContentType;
        response.ContentLength = body.Length;
        response.BodyWriter.Write(body);
    }

    private static void WriteJson(HttpResponse response)
    {
        var body = HelloWorldJson.Serialize();
        response.StatusCode = StatusCodes.Status200OK;
        response.ContentType = JsonContentType;
        response.ContentLength = body.Length;
        response.BodyWriter.Write(body);
    }
}
