using Microsoft.AspNetCore.Mvc;

namespace TechEmpower.Scenarios;

/// <summary>
/// The application scenarios of the published hosting-model comparisons (text, JSON, XML and an
/// HTML view), served through MVC so each request pays for routing, action selection, formatters
/// and the view engine as a real application does.
/// </summary>
public sealed class ScenariosController : Controller
{
    /// <summary>The /text body: the Latin alphabet and the digits.</summary>
    public const string Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

    /// <summary>GET /text: a short plain-text body.</summary>
    /// <returns>The alphabet as text/plain.</returns>
    [HttpGet("/text")]
    public ContentResult Text() => Content(Alphabet, "text/plain");

    /// <summary>GET /json-object: a new <see cref="ScenarioItem"/> serialized by the JSON output formatter.</summary>
    /// <returns>The item, as application/json.</returns>
    [HttpGet("/json-object")]
    [Produces("application/json")]
    public ScenarioItem JsonObject() => ScenarioItem.Create();

    /// <summary>GET /xml: a new <see cref="ScenarioItem"/> serialized by the XmlSerializer output formatter.</summary>
    /// <returns>The item, as application/xml.</returns>
    [HttpGet("/xml")]
    [Produces("application/xml")]
    public ScenarioItem Xml() => ScenarioItem.Create();

    /// <summary>GET /html: the Razor view Views/Scenarios/Html.cshtml rendered from a new model.</summary>
    /// <returns>The rendered page, as text/html.</returns>
    [HttpGet("/html")]
    public ViewResult Html() => View(HtmlPageModel.Create());
}
